"""A running job's diagnosis (``job.diagnose()``, ``stagectl diagnose``; docs/diagnosis.md):
what each rank is doing now and what it waits on, the job's stall and its stragglers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from stagecoach.events import _seconds, state_name


@dataclass
class RankDiagnosis:
    """One rank as the coordinator last heard of it. `summary` is one line, e.g. "RECV_F stage 3
    microbatch 5 from rank 1 (host-b:41234) (tag 7), waiting 41.2 s"; `recent` its latest
    actions, oldest first, as (global step, action, seconds it ran, seconds it waited)."""

    rank: int
    replica: int
    worker_id: str
    address: str
    summary: str
    phase: str
    action: str
    beacon_age: Optional[float]  # seconds; None before a beacon arrived
    recent: List[tuple] = field(default_factory=list)

    @staticmethod
    def from_proto(r: Any) -> "RankDiagnosis":
        p = r.progress
        return RankDiagnosis(
            rank=r.rank, replica=r.replica, worker_id=r.worker_id, address=r.address,
            summary=r.summary, phase=_phase(p.phase), action=p.action,
            beacon_age=_seconds(r.beacon_age) if r.HasField("progress") else None,
            recent=[(a.global_step, a.action, a.duration_us / 1e6, a.wait_us / 1e6)
                    for a in p.recent])


@dataclass
class Stall:
    """A RUNNING job's step ran past its stall bound (the STALLED condition)."""

    global_step: int
    running: float  # seconds
    bound: float    # seconds
    ranks: List[RankDiagnosis]

    @staticmethod
    def from_proto(s: Any) -> "Stall":
        return Stall(global_step=s.global_step, running=_seconds(s.running),
                     bound=_seconds(s.bound),
                     ranks=[RankDiagnosis.from_proto(r) for r in s.ranks])


@dataclass
class Straggler:
    """A rank persistently slower than its peers with the same work: `ratio` is its compute
    over theirs (median over the window), `kind_ratios` the same per action kind."""

    rank: int
    replica: int
    worker_id: str
    ratio: float
    kind_ratios: Dict[str, float]
    window_steps: int

    @staticmethod
    def from_proto(s: Any) -> "Straggler":
        return Straggler(rank=s.rank, replica=s.replica, worker_id=s.worker_id, ratio=s.ratio,
                         kind_ratios=dict(s.kind_ratios), window_steps=s.window_steps)


@dataclass
class Diagnosis:
    """``job.diagnose()``: every rank now, the stall (None unless STALLED), the stragglers, and
    the stall bound in force (seconds)."""

    job_id: str
    state: str
    global_steps_done: int
    ranks: List[RankDiagnosis]
    stall: Optional[Stall]
    stragglers: List[Straggler]
    stall_bound: float
    median_step: float
    raw: Any = None

    @staticmethod
    def from_proto(d: Any) -> "Diagnosis":
        return Diagnosis(
            job_id=d.job_id, state=state_name(d.state), global_steps_done=d.global_steps_done,
            ranks=[RankDiagnosis.from_proto(r) for r in d.ranks],
            stall=Stall.from_proto(d.stall) if d.HasField("stall") else None,
            stragglers=[Straggler.from_proto(s) for s in d.stragglers],
            stall_bound=_seconds(d.stall_bound), median_step=_seconds(d.median_step), raw=d)


def _phase(value: int) -> str:
    from stagecoach.v1 import diagnosis_pb2
    return diagnosis_pb2.RankPhase.Name(value).replace("RANK_PHASE_", "")


__all__ = ["Diagnosis", "RankDiagnosis", "Stall", "Straggler"]
