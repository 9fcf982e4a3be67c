"""A job on the coordinator: its status and events, step control, client batches, generation."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple, Union

from stagecoach import tensors
from stagecoach._progress import StepProgress
from stagecoach.errors import DeadlineExceeded, InvalidArgument, JobFailed
from stagecoach.events import (AnyEvent, JobStatus, StateChanged, StepCompleted, StepResult,
                               event_from_proto)
from stagecoach.v1 import coordinator_pb2, generation_pb2

if TYPE_CHECKING:
    from stagecoach.client import Client
    from stagecoach.diagnosis import Diagnosis

Prompt = Union[str, Sequence[int], Sequence[Sequence[int]]]


class Job:
    """A submitted job, by id. Cheap to make: every method asks the coordinator."""

    def __init__(self, client: "Client", job_id: str):
        self._client = client
        self._rpc = client._rpc
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self, history: bool = False) -> JobStatus:
        """The job now; with `history`, every step's loss (else the latest 100)."""
        reply = self._rpc.call("GetJob", coordinator_pb2.GetJobRequest(
            job_id=self.id, history_all=history), self._client.timeout)
        return JobStatus.from_proto(reply.job)

    def diagnose(self) -> "Diagnosis":
        """What each rank is doing now (its action, the peer and tag it waits on, its latest
        actions), the job's stall and its stragglers (``stagectl diagnose``)."""
        from stagecoach.diagnosis import Diagnosis
        reply = self._rpc.call("DiagnoseJob", coordinator_pb2.DiagnoseJobRequest(job_id=self.id),
                               self._client.timeout)
        return Diagnosis.from_proto(reply)

    def watch(self, from_sequence: int = 0, timeout: Optional[float] = None
              ) -> Iterator[AnyEvent]:
        """The job's events from `from_sequence` (0: all it keeps), then new ones as they
        happen, until the job ends (or `timeout` seconds pass: DeadlineExceeded)."""
        request = coordinator_pb2.WatchJobRequest(job_id=self.id, from_sequence=from_sequence)
        for event in self._rpc.stream("WatchJob", request, timeout):
            yield event_from_proto(event)

    def wait(self, timeout: Optional[float] = None, progress: bool = False,
             check: bool = True) -> JobStatus:
        """Blocks until the job ends and returns its final status. With `progress`, a bar of its
        steps (tqdm, where installed; lines otherwise). With `check`, a job that FAILED or was
        CANCELLED raises JobFailed with its reason. `timeout` (seconds, None: as long as the job
        runs) raises DeadlineExceeded; the job keeps running."""
        bar = StepProgress(self.id) if progress else None
        try:
            for event in self.watch(timeout=timeout):
                if bar is not None and isinstance(event, StepCompleted):
                    bar.step(event)
                if isinstance(event, StateChanged) and event.final:
                    break
        finally:
            if bar is not None:
                bar.close()
        status = self.status()
        if check and status.state in ("FAILED", "CANCELLED"):
            why = status.failure.error if status.failure is not None else status.reason
            raise JobFailed(f"job {self.id} {status.state}: {why}", status)
        return status

    def wait_for_state(self, state: str, timeout: float = 60.0) -> JobStatus:
        """Polls until the job is in `state` (e.g. "PAUSED"); DeadlineExceeded after
        `timeout` seconds, JobFailed when it ends in another state first."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status.state == state:
                return status
            if status.done:
                raise JobFailed(f"job {self.id} ended {status.state} before {state}", status)
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"job {self.id} is {status.state}, not {state}, after "
                                       f"{timeout:g} s")
            time.sleep(0.05)

    def pause(self) -> int:
        """Pauses after the current step; returns the global step it holds at (the job turns
        PAUSED once every rank holds: wait_for_state("PAUSED"))."""
        return self._rpc.call("PauseJob", coordinator_pb2.PauseJobRequest(job_id=self.id),
                              self._client.timeout).global_step

    def resume(self) -> None:
        """Resumes a PAUSED job through to its last step."""
        self._rpc.call("ResumeJob", coordinator_pb2.ResumeJobRequest(job_id=self.id),
                       self._client.timeout)

    def run(self, steps: int) -> int:
        """Runs `steps` more steps (a PAUSED job holds again after them); returns the global
        step it runs until."""
        return self._rpc.call("RunSteps", coordinator_pb2.RunStepsRequest(
            job_id=self.id, steps=steps), self._client.timeout).until_global_step

    def cancel(self, reason: str = "") -> None:
        """Cancels a pending or running job; its workers return to idle."""
        self._rpc.call("CancelJob", coordinator_pb2.CancelJobRequest(job_id=self.id,
                                                                     reason=reason),
                       self._client.timeout)

    def checkpoint(self) -> Tuple[int, str]:
        """Asks a RUNNING or PAUSED job to write a checkpoint: (its step, its directory)."""
        reply = self._rpc.call("CheckpointJob", coordinator_pb2.CheckpointJobRequest(
            job_id=self.id), self._client.timeout)
        return reply.step, reply.directory

    def step(self, inputs: Any, targets: Any = None, timeout: float = 300.0) -> StepResult:
        """One training step of a PAUSED job on a client batch, like PyTorch's
        ``schedule.step(x, target=y)``: NumPy arrays or torch tensors with the rows in dim 0.
        Ragged token rows (a list of 1-D rows of different lengths) are padded and sent with
        their lengths; without `targets`, each row is a document whose next tokens are its
        targets. The job is PAUSED again afterwards."""
        request = self._step_request(inputs, targets, forward_only=False, timeout=timeout)
        reply = self._rpc.call("StepJob", request, timeout + 30.0)
        return StepResult(reply.global_step, reply.loss if reply.HasField("loss") else None,
                          list(reply.microbatch_losses),
                          reply.step_time.seconds + reply.step_time.nanos / 1e9)

    def forward(self, inputs: Any, timeout: float = 300.0) -> Any:
        """Inference on a PAUSED job's current weights: the last stage's outputs, one row per
        input row (a torch tensor when `inputs` is one). The timeline does not move."""
        request = self._step_request(inputs, None, forward_only=True, timeout=timeout)
        reply = self._rpc.call("StepJob", request, timeout + 30.0)
        return tensors.from_tensor_data(reply.outputs, _any_torch(inputs))

    def _step_request(self, inputs: Any, targets: Any, forward_only: bool,
                      timeout: float) -> coordinator_pb2.StepJobRequest:
        request = coordinator_pb2.StepJobRequest(job_id=self.id, forward_only=forward_only)
        request.timeout.FromMilliseconds(int(timeout * 1000))
        if tensors.is_ragged(inputs):
            rows = list(inputs)
            if targets is None and not forward_only:
                if any(len(r) < 2 for r in rows):
                    raise InvalidArgument("inputs: a document row needs at least 2 tokens")
                targets = [r[1:] for r in rows]
                rows = [r[:-1] for r in rows]
            padded, padded_targets, lengths = tensors.pad_rows(
                rows, None if forward_only else targets)
            request.inputs.CopyFrom(tensors.to_tensor_data(padded, "inputs"))
            if padded_targets is not None:
                request.targets.CopyFrom(tensors.to_tensor_data(padded_targets, "targets"))
            request.row_lengths.extend(lengths)
            return request
        request.inputs.CopyFrom(tensors.to_tensor_data(inputs, "inputs"))
        if not forward_only:
            if targets is None:
                raise InvalidArgument("targets: a training step needs targets")
            request.targets.CopyFrom(tensors.to_tensor_data(targets, "targets"))
        return request

    def generate(self, prompt: Prompt, tokens: int = 100, temperature: float = 0.0,
                 top_k: int = 0, seed: int = 0, tokenizer: Any = None,
                 timeout: float = 600.0) -> Iterator[Any]:
        """Generates `tokens` tokens after `prompt` from a PAUSED or SUCCEEDED built-in decoder
        job, streaming them as they are made. `prompt` is token ids, a list of prompts (one
        row each), or text with a `tokenizer` (anything with encode(text) -> ids and
        decode(ids) -> text: a CharVocabulary, a SentencePieceProcessor). Yields, per new
        token: its id (a list of ids with several prompts), or its text with a tokenizer."""
        request = generation_pb2.GenerateRequest(job_id=self.id, tokens=tokens,
                                                 temperature=temperature, top_k=top_k, seed=seed)
        request.timeout.FromMilliseconds(int(timeout * 1000))
        rows = _prompt_rows(prompt, tokenizer)
        if len(rows) == 1 and not _is_batch(prompt):
            request.prompt.extend(rows[0])
        else:
            for row in rows:
                request.prompts.add().ids.extend(row)
        batch = _is_batch(prompt)
        made: List[List[int]] = [[] for _ in rows]
        said = [""] * len(rows)
        for reply in self._rpc.stream("Generate", request, timeout + 30.0,
                                      self._rpc.generation):
            ids: List[int] = list(reply.tokens)
            if tokenizer is None:
                yield ids if batch else ids[0]
                continue
            # Each row's text so far, decoded whole (a piece's spacing depends on its
            # neighbours), and what it added.
            texts = []
            for r, token in enumerate(ids):
                made[r].append(token)
                text = tokenizer.decode(made[r])
                texts.append(text[len(said[r]):] if text.startswith(said[r]) else text)
                said[r] = text
            yield texts if batch else texts[0]


def _any_torch(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(tensors.is_torch(v) for v in value)
    return tensors.is_torch(value)


def _is_batch(prompt: Prompt) -> bool:
    """Several prompts: a list of texts or of id lists."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and not isinstance(prompt[0], int) and not hasattr(prompt[0], "__index__"))


def _prompt_rows(prompt: Prompt, tokenizer: Any) -> List[List[int]]:
    items = list(prompt) if _is_batch(prompt) else [prompt]
    rows = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if tokenizer is None:
                raise InvalidArgument(f"prompt {i}: text needs a tokenizer")
            item = tokenizer.encode(item)
        rows.append([int(t) for t in item])
        if not rows[-1]:
            raise InvalidArgument(f"prompt {i}: empty")
    return rows
