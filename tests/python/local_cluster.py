"""A coordinator and workers of the build tree as child processes on loopback (ports 0), for the
Python client's tests: the Python counterpart of tests/support/local_cluster.h.

Environment: STAGECOACH_BINARY_DIR (the build tree), set by CTest."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence

import stagecoach

START_TIMEOUT = 60.0


def binary_dir() -> str:
    path = os.environ.get("STAGECOACH_BINARY_DIR")
    if not path:
        raise RuntimeError("STAGECOACH_BINARY_DIR is not set (run the tests through CTest)")
    return path


class LocalCluster:
    """A coordinator and `workers` workers; `client_token`: the coordinator requires it."""

    def __init__(self, workers: int = 2, client_token: Optional[str] = None,
                 metrics: bool = False, coordinator_args: Sequence[str] = ()):
        self.dir = tempfile.mkdtemp(prefix="stagecoach-py-")
        self._procs: List[subprocess.Popen] = []
        self._logs: List[str] = []
        # With `metrics`: every daemon serves /metrics; their addresses, the coordinator's first.
        self.metrics: List[str] = []
        extra = ["--metrics-listen", "127.0.0.1:0"] if metrics else []
        try:
            args = [os.path.join(binary_dir(), "coordinator", "stagecoach-coordinator"),
                    "--listen", "127.0.0.1:0", *extra, *coordinator_args]
            self.client_args: List[str] = []
            if client_token is not None:
                token_file = self.write_file("client.token", client_token + "\n")
                args += ["--client-token-file", token_file]
                self.client_args = ["--token-file", token_file]
            self.address = self._start("coordinator", args)
            for i in range(workers):
                self._start(f"worker-{i}", [
                    os.path.join(binary_dir(), "worker", "stagecoach-worker"),
                    "--coordinator", self.address, "--listen", "127.0.0.1:0",
                    "--name", f"worker-{i}", *extra])
            self._wait_idle(workers, client_token)
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, args: Sequence[str]) -> str:
        """Starts a daemon; returns the address of its "listening on HOST:PORT" line."""
        log = os.path.join(self.dir, f"{name}.log")
        self._logs.append(log)
        with open(log, "w") as out:
            self._procs.append(subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True))
        wants_metrics = "--metrics-listen" in args
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with open(log) as f:
                lines = f.read().splitlines()
            listening = [l.split()[-1] for l in lines if l.startswith("listening on ")]
            metrics = [l.split()[-1] for l in lines if l.startswith("metrics on ")]
            if listening and (metrics or not wants_metrics):
                self.metrics += metrics[:1]
                return listening[0]
            if self._procs[-1].poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{name} did not say where it listens:\n{self.logs()}")

    def _wait_idle(self, workers: int, token: Optional[str]) -> None:
        with stagecoach.Client(self.address, token=token) as client:
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                if sum(w.state == "IDLE" for w in client.workers()) >= workers:
                    return
                time.sleep(0.05)
        raise RuntimeError(f"{workers} workers did not register:\n{self.logs()}")

    def freeze_worker(self, index: int, frozen: bool = True) -> None:
        """SIGSTOPs (or with frozen=False SIGCONTs) worker `index`: alive but silent."""
        p = self._procs[1 + index]
        os.killpg(p.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def kill_worker(self, index: int) -> None:
        """SIGKILLs worker `index` (0-based): it stops heartbeating at once."""
        p = self._procs[1 + index]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def client(self, **kwargs) -> stagecoach.Client:
        return stagecoach.Client(self.address, **kwargs)

    def write_file(self, name: str, content) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
        return path

    def stagectl(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """stagectl of the build tree against this cluster; raises on a non-zero exit."""
        argv = [os.path.join(binary_dir(), "client", "stagectl"), "--coordinator", self.address,
                *self.client_args, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{' '.join(argv)} did not end within {timeout:g} s; it said:\n"
                               f"{e.stdout or ''}{e.stderr or ''}\n{self.logs()}") from None
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}"
                               f"{done.stderr}")
        return done

    def stagectl_json(self, *args: str, timeout: float = 120.0):
        return json.loads(self.stagectl(*args, "-o", "json", timeout=timeout).stdout)

    def logs(self) -> str:
        out = []
        for log in self._logs:
            try:
                with open(log) as f:
                    out.append(f"--- {os.path.basename(log)} ---\n{f.read()[-4000:]}")
            except OSError:
                pass
        return "\n".join(out)

    def close(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self._procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
