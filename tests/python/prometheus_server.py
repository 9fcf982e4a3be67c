"""A real Prometheus (Debian's `prometheus` package) for tests: it scrapes the given /metrics
endpoints every second, optionally evaluates rule files, and answers PromQL through its HTTP API.
Listens on a port of its own choosing (127.0.0.1:0, read back from its log)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional, Sequence

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


def available() -> bool:
    return os.access(BINARY, os.X_OK)


class PrometheusServer:
    def __init__(self, targets: Sequence[str], work_dir: str,
                 rule_files: Sequence[str] = (), timeout: float = 60.0):
        self.dir = os.path.join(work_dir, "prometheus")
        os.makedirs(self.dir, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": list(rule_files),
            "scrape_configs": [{"job_name": "stagecoach",
                                "static_configs": [{"targets": list(targets)}]}],
        }
        config_path = os.path.join(self.dir, "prometheus.yml")
        with open(config_path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        self.log = os.path.join(self.dir, "prometheus.log")
        with open(self.log, "w") as out:
            self._proc = subprocess.Popen(
                [BINARY, f"--config.file={config_path}",
                 f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                 "--web.listen-address=127.0.0.1:0"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.address = self._wait_listening(timeout)

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        pattern = re.compile(r'msg="Listening on" address=(\S+)')
        while time.monotonic() < deadline:
            with open(self.log) as f:
                found = pattern.search(f.read())
            if found and self._ready(found.group(1)):
                return found.group(1)
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"prometheus did not start:\n{self.logs()}")

    @staticmethod
    def _ready(address: str) -> bool:
        """Whether Prometheus answers /-/ready (it says 503 while its storage starts)."""
        try:
            with urllib.request.urlopen(f"http://{address}/-/ready", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def get(self, path: str, params: Optional[Dict[str, str]] = None) -> dict:
        """GET /api/v1/<path>: its `data`; RuntimeError with Prometheus's error otherwise."""
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> List[dict]:
        """The series an instant query returns now."""
        return self.get("query", {"query": expr})["result"]

    def alerts(self) -> List[dict]:
        return self.get("alerts")["alerts"]

    def logs(self) -> str:
        with open(self.log) as f:
            return f.read()[-4000:]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
