"""Stagecoach's Python client: submit, watch and steer pipeline-parallel training jobs on a
Stagecoach coordinator over its gRPC API.

    import stagecoach
    client = stagecoach.Client("localhost:7000")
    job = client.submit("job.yaml")
    for event in job.watch():
        print(event)

See docs/python.md.
"""

from stagecoach._rpc import TLS
from stagecoach.client import Client
from stagecoach.errors import (Aborted, Cancelled, DeadlineExceeded, FailedPrecondition,
                               InvalidArgument, InvalidSpec, JobFailed, NotFound,
                               PermissionDenied, ResourceExhausted, StagecoachError,
                               Unauthenticated, Unavailable)
from stagecoach.diagnosis import Diagnosis, RankDiagnosis, Stall, Straggler
from stagecoach.events import (Event, EventsDropped, Failure, JobStatus, PlanCandidate,
                               ReplicaHealed, ReplicaLost, SnapshotTaken, Stalled, StateChanged,
                               StepCompleted, StepResult, Straggling, Worker)
from stagecoach.job import Job
from stagecoach.vocab import CharVocabulary

__all__ = [
    "Aborted", "Cancelled", "CharVocabulary", "Client", "DeadlineExceeded", "Diagnosis", "Event",
    "EventsDropped", "FailedPrecondition", "Failure", "InvalidArgument", "InvalidSpec", "Job",
    "JobFailed", "JobStatus", "NotFound", "PermissionDenied", "PlanCandidate", "ReplicaHealed",
    "RankDiagnosis", "ReplicaLost", "ResourceExhausted", "SnapshotTaken", "Stall", "Stalled",
    "StagecoachError", "StateChanged", "StepCompleted", "StepResult", "Straggler", "Straggling",
    "TLS", "Unauthenticated", "Unavailable", "Worker",
]
