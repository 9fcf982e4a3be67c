"""The Stagecoach client: submit and find jobs, plan specs, run inference, list workers.

    import stagecoach
    client = stagecoach.Client("coordinator:7000", token_file="~/.stagecoach/token")
    job = client.submit({"name": "demo", "model": {...}, ...})
    job.wait(progress=True)
    print(job.status().losses)

Every call has a deadline (`timeout`, seconds) and raises a StagecoachError subclass with the
server's message when it fails.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from stagecoach import tensors
from stagecoach._rpc import TLS, Connection, read_token
from stagecoach.errors import StagecoachError
from stagecoach.events import JobStatus, PlanCandidate, Worker
from stagecoach.job import Job
from stagecoach.v1 import coordinator_pb2, types_pb2

Spec = Union[Dict[str, Any], str, "os.PathLike[str]"]


def spec_text(spec: Spec) -> Tuple[str, str]:
    """A spec as YAML text and where it came from: a dict (sent as JSON, which is YAML), a path
    to a YAML file, or YAML text."""
    if isinstance(spec, dict):
        try:
            return json.dumps(spec), "<dict>"
        except (TypeError, ValueError) as e:
            raise StagecoachError(f"spec: the dict cannot be written as YAML: {e}") from None
    if isinstance(spec, os.PathLike) or (
            isinstance(spec, str) and "\n" not in spec and spec.endswith((".yaml", ".yml"))):
        path = os.fspath(spec)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), path
        except OSError as e:
            raise StagecoachError(f"spec: cannot read '{path}': {e.strerror}") from None
    if isinstance(spec, str):
        return spec, "<text>"
    raise StagecoachError(f"spec: expected a dict, a path or YAML text, got {type(spec).__name__}")


class Client:
    """A connection to a Stagecoach coordinator.

    Args:
        address: the coordinator's gRPC address, host:port.
        token: the client token (the coordinator's --client-token-file), or
        token_file: a file holding it.
        tls: a TLS when the coordinator serves TLS; None for plaintext.
        timeout: the deadline of each call, seconds (steps and inference take their own).
    """

    def __init__(self, address: str, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls: Optional[TLS] = None,
                 timeout: float = 30.0):
        self._rpc = Connection(address, read_token(token, token_file), tls)
        self.timeout = timeout

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel; the jobs keep running."""
        self._rpc.close()

    def submit(self, spec: Spec, paused: bool = False) -> Job:
        """Validates and queues a job. `spec` is a dict, a path to a YAML file or YAML text.
        With `paused`, the job holds before its first step (step it with job.step(), or
        job.resume()). InvalidSpec names the field and the reason; nothing is queued then."""
        text, origin = spec_text(spec)
        reply = self._rpc.call(
            "SubmitJob",
            coordinator_pb2.SubmitJobRequest(spec_yaml=text, spec_origin=origin,
                                             start_paused=paused), self.timeout)
        return Job(self, reply.job_id)

    def job(self, job_id: str) -> Job:
        """The job `job_id` (checked: NotFound when the coordinator does not know it)."""
        job = Job(self, job_id)
        job.status()
        return job

    def list_jobs(self, page_size: int = 100) -> Iterator[JobStatus]:
        """Every job the coordinator keeps, oldest first, as summaries (losses: the latest
        only), following the pages."""
        token = ""
        while True:
            reply = self._rpc.call(
                "ListJobs", coordinator_pb2.ListJobsRequest(page_size=page_size, page_token=token),
                self.timeout)
            for job in reply.jobs:
                yield JobStatus.from_proto(job)
            token = reply.next_page_token
            if not token:
                return

    def workers(self) -> List[Worker]:
        """Every worker the coordinator knows, lost ones included."""
        reply = self._rpc.call("ListWorkers", coordinator_pb2.ListWorkersRequest(), self.timeout)
        return [Worker(w.id, w.name, w.address,
                       types_pb2.WorkerState.Name(w.state).replace("WORKER_STATE_", ""),
                       w.job_id, w.rank, w.device, list(w.transports)) for w in reply.workers]

    def plan(self, spec: Spec, memory_limit: Optional[int] = None) -> List[PlanCandidate]:
        """The plans the coordinator would choose from for `spec`, best first (``stagectl
        plan``): its model profiled on a live worker, every schedule simulated. `memory_limit`
        (bytes per rank) marks which fit."""
        text, origin = spec_text(spec)
        request = coordinator_pb2.PlanSpecRequest(spec_yaml=text, spec_origin=origin,
                                                  memory_limit_bytes=memory_limit or 0)
        reply = self._rpc.call("PlanSpec", request, max(self.timeout, 300.0))
        return [PlanCandidate(c.schedule, c.stages_per_rank, c.num_stages, c.microbatches,
                              c.split_policy, c.step_seconds, c.bubble, list(c.rank_peak_bytes),
                              c.fits) for c in reply.candidates]

    def infer(self, spec: Spec, inputs: Any, timeout: float = 300.0) -> Any:
        """Forward-only inference on `inputs` (a NumPy array or torch tensor, rows in dim 0)
        with the model of `spec`, as a job of one step: the last stage's outputs, one row per
        input row (a torch tensor when `inputs` is one)."""
        text, origin = spec_text(spec)
        request = coordinator_pb2.InferRequest(
            spec_yaml=text, spec_origin=origin, inputs=tensors.to_tensor_data(inputs, "inputs"))
        request.timeout.FromMilliseconds(int(timeout * 1000))
        reply = self._rpc.call("Infer", request, timeout + 30.0)
        return tensors.from_tensor_data(reply.outputs, tensors.is_torch(inputs))
