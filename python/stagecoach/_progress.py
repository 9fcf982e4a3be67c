"""Progress of a job's steps for Job.wait(progress=True): a tqdm bar (tqdm.auto picks the
notebook widget in Jupyter) where tqdm is installed, else a line on stderr every few seconds."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from stagecoach.events import StepCompleted


class StepProgress:
    def __init__(self, job_id: str):
        self._job_id = job_id
        self._bar: Optional[Any] = None
        self._last_line = 0.0
        try:
            from tqdm.auto import tqdm  # optional

            self._tqdm = tqdm
        except ImportError:
            self._tqdm = None

    def step(self, event: StepCompleted) -> None:
        loss = "-" if event.loss is None else f"{event.loss:.4f}"
        if self._tqdm is not None:
            if self._bar is None:
                self._bar = self._tqdm(total=event.steps_total, desc=self._job_id, unit="step")
            self._bar.total = event.steps_total
            self._bar.n = event.global_step + 1
            self._bar.set_postfix(loss=loss, refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._last_line >= 2.0 or event.global_step + 1 >= event.steps_total:
            self._last_line = now
            print(f"{self._job_id}: step {event.global_step + 1}/{event.steps_total} "
                  f"loss {loss} ({event.step_time:.3f} s/step)", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
