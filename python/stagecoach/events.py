"""Typed views of what the coordinator reports: a job's status and its events.

These are plain dataclasses made from the API's messages (``stagecoach.v1``); each keeps the
message it came from in ``raw`` for the fields not copied here.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from stagecoach.v1 import types_pb2

# Job states as the API names them, without the JOB_STATE_ prefix.
FINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def state_name(value: int) -> str:
    """"RUNNING" for JOB_STATE_RUNNING."""
    return types_pb2.JobState.Name(value).replace("JOB_STATE_", "")


def _time(ts: Any) -> Optional[datetime.datetime]:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime().replace(tzinfo=datetime.timezone.utc)


def _seconds(duration: Any) -> float:
    return duration.seconds + duration.nanos / 1e9


@dataclass
class Failure:
    """Why a job failed: the rank, its worker, the action it was in and the error."""

    rank: int
    worker_id: str
    action: str
    error: str


@dataclass
class JobStatus:
    """A job as the coordinator sees it (``stagectl status``)."""

    id: str
    name: str
    state: str
    reason: str
    global_step: int
    steps_total: int
    losses: List[float]
    eval_losses: List[tuple]
    schedule: str
    num_stages: int
    num_ranks: int
    replicas: int
    microbatches: int
    checkpoints: List[tuple]
    failure: Optional[Failure]
    created: Optional[datetime.datetime]
    raw: types_pb2.Job = field(repr=False)

    @property
    def done(self) -> bool:
        """Whether the job reached a final state (SUCCEEDED, FAILED or CANCELLED)."""
        return self.state in FINAL_STATES

    @property
    def loss(self) -> Optional[float]:
        """The latest step's loss, if any step reported one."""
        return self.losses[-1] if self.losses else None

    @staticmethod
    def from_proto(job: types_pb2.Job) -> "JobStatus":
        failure = None
        if job.HasField("failure") and job.failure.error:
            f = job.failure
            failure = Failure(f.rank, f.worker_id, f.action, f.error)
        return JobStatus(
            id=job.id, name=job.name, state=state_name(job.state), reason=job.reason,
            global_step=job.global_steps_done, steps_total=job.steps_total,
            losses=list(job.losses),
            eval_losses=[(e.global_step, e.loss) for e in job.evals],
            schedule=job.schedule, num_stages=job.num_stages, num_ranks=job.num_ranks,
            replicas=job.replicas, microbatches=job.microbatches,
            checkpoints=[(c.step, c.directory) for c in job.checkpoints],
            failure=failure, created=_time(job.created_time), raw=job)


@dataclass
class Event:
    """One event of a job's log (``job.watch()``): `sequence` orders them."""

    job_id: str
    sequence: int
    time: Optional[datetime.datetime]


@dataclass
class StateChanged(Event):
    """The job entered `state` (PENDING, RUNNING, PAUSED, SUCCEEDED, ...) for `reason`."""

    state: str
    reason: str

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass
class StepCompleted(Event):
    """A training step finished on every rank (``stagectl watch``'s step lines)."""

    global_step: int
    steps_total: int
    loss: Optional[float]
    step_time: float  # seconds, the slowest rank's
    samples_per_second: float
    learning_rate: float
    grad_norm: Optional[float]
    skipped: bool
    eval_loss: Optional[float]
    client_batch: bool
    tokens_per_second: float
    padding_waste: float
    bubble_ratios: List[float]


@dataclass
class EventsDropped(Event):
    """Events from_sequence..to_sequence were no longer kept when the watch asked for them."""

    from_sequence: int
    to_sequence: int


@dataclass
class ReplicaLost(Event):
    """A data-parallel replica was lost; the job carries on with the healthy ones."""

    replica: int
    reason: str
    healthy_replicas: int


@dataclass
class ReplicaHealed(Event):
    """A lost replica rejoined from a donor replica's state."""

    replica: int
    donor_replica: int
    healthy_replicas: int


@dataclass
class SnapshotTaken(Event):
    """An in-memory snapshot of every rank's state was completed."""

    global_step: int
    bytes: int


@dataclass
class Stalled(Event):
    """A step ran past the stall bound (`ended` False), or the stalled step completed
    (`ended` True, `running` its whole time). `summaries` say what each rank was doing, by
    "replica/rank"."""

    global_step: int
    running: float
    bound: float
    ended: bool
    summaries: Dict[str, str]


@dataclass
class Straggling(Event):
    """A rank started (`straggling` True) or stopped straggling behind its peers."""

    rank: int
    replica: int
    worker_id: str
    ratio: float
    straggling: bool


AnyEvent = Union[StateChanged, StepCompleted, EventsDropped, ReplicaLost, ReplicaHealed,
                 SnapshotTaken, Stalled, Straggling, Event]


def event_from_proto(e: types_pb2.JobEvent) -> AnyEvent:
    """The typed event of a JobEvent (a plain Event for a kind this client does not know)."""
    head = dict(job_id=e.job_id, sequence=e.sequence, time=_time(e.time))
    kind = e.WhichOneof("kind")
    if kind == "state_change":
        return StateChanged(**head, state=state_name(e.state_change.state),
                            reason=e.state_change.reason)
    if kind == "step_completed":
        s = e.step_completed
        return StepCompleted(
            **head, global_step=s.global_step, steps_total=s.steps_total,
            loss=s.loss if s.HasField("loss") else None, step_time=_seconds(s.step_time),
            samples_per_second=s.samples_per_second, learning_rate=s.learning_rate,
            grad_norm=s.grad_norm if s.HasField("grad_norm") else None, skipped=s.skipped,
            eval_loss=s.eval_loss if s.HasField("eval_loss") else None,
            client_batch=s.client_batch, tokens_per_second=s.tokens_per_second,
            padding_waste=s.padding_waste, bubble_ratios=list(s.bubble_ratios))
    if kind == "events_dropped":
        return EventsDropped(**head, from_sequence=e.events_dropped.from_sequence,
                             to_sequence=e.events_dropped.to_sequence)
    if kind == "replica_lost":
        r = e.replica_lost
        return ReplicaLost(**head, replica=r.replica, reason=r.reason,
                           healthy_replicas=r.healthy_replicas)
    if kind == "replica_healed":
        r = e.replica_healed
        return ReplicaHealed(**head, replica=r.replica, donor_replica=r.donor_replica,
                             healthy_replicas=r.healthy_replicas)
    if kind == "snapshot_taken":
        return SnapshotTaken(**head, global_step=e.snapshot_taken.global_step,
                             bytes=e.snapshot_taken.bytes)
    if kind in ("stalled", "stall_ended"):
        s = getattr(e, kind).stall
        return Stalled(**head, global_step=s.global_step, running=_seconds(s.running),
                       bound=_seconds(s.bound), ended=kind == "stall_ended",
                       summaries={f"{r.replica}/{r.rank}": r.summary for r in s.ranks})
    if kind == "straggler":
        s = e.straggler.straggler
        return Straggling(**head, rank=s.rank, replica=s.replica, worker_id=s.worker_id,
                          ratio=s.ratio, straggling=e.straggler.straggling)
    return Event(**head)


@dataclass
class StepResult:
    """What ``job.step()`` returns: the timeline step the batch ran as, its loss (the job's
    normalisation: by tokens for token data) and each microbatch's loss."""

    global_step: int
    loss: Optional[float]
    microbatch_losses: List[float]
    step_time: float


@dataclass
class Worker:
    """A worker the coordinator knows (``stagectl workers``)."""

    id: str
    name: str
    address: str
    state: str
    job_id: str
    rank: int
    device: str
    transports: List[str]


@dataclass
class PlanCandidate:
    """One plan ``client.plan()`` considered, best first: its schedule, stages, microbatches,
    predicted step time and peak memory per rank, and whether it fits the memory limit."""

    schedule: str
    stages_per_rank: int
    num_stages: int
    microbatches: int
    split_policy: str
    step_seconds: float
    bubble: float
    rank_peak_bytes: List[int]
    fits: bool
