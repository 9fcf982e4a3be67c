"""The Grafana dashboard and the alerts proven against a real Prometheus: Debian's `prometheus` scrapes a live
cluster (a coordinator and 4 workers) running a 2-replica GPT job on packed token data with the
training recipe on (clipping, a learning-rate schedule, eval passes), and every query of every
panel of deploy/grafana/stagecoach-dashboard.json, evaluated through Prometheus's HTTP API, returns
at least one series. Panels whose data needs an event get it: a failed call for the RPC errors.
The chart's alerting rules (deploy/helm/stagecoach/files/alerts.yaml) pass `promtool check rules`,
and Prometheus, evaluating them with their `for:` waits shortened, fires the ones a test can
provoke: steps skipped (a client batch of NaN) and a worker lost (SIGKILL). Skipped where the
prometheus binary is missing (scripts/test.sh installs it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import unittest

import numpy as np

import prometheus_server
import stagecoach
from local_cluster import LocalCluster

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(SOURCE, "deploy", "grafana", "stagecoach-dashboard.json")
ALERTS = os.path.join(SOURCE, "deploy", "helm", "stagecoach", "files", "alerts.yaml")

# Grafana's variables as a query over the last minutes would have them.
VARIABLES = {"$__rate_interval": "15s", "$__range": "5m", "$__interval": "2s", "$job": ".*",
             "${job}": ".*"}


def panel_queries():
    """(panel title, expr) of every panel target, rows' nested panels included."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    panels = []
    for p in dashboard["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    out = []
    for p in panels:
        for t in p.get("targets", []):
            if "expr" in t:
                expr = t["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                out.append((p.get("title", ""), expr))
    return out


def token_file(path: str) -> None:
    rng = np.random.default_rng(3)
    phrases = [rng.integers(0, 31, 2 + int(rng.integers(0, 9))) for _ in range(6)]
    tokens = np.concatenate([np.append(phrases[int(rng.integers(0, 6))], 31)
                             for _ in range(120)])
    tokens.astype("<u2").tofile(path)


@unittest.skipUnless(prometheus_server.available(),
                     "the prometheus binary is missing (Debian's prometheus package; "
                     "scripts/test.sh installs it)")
class Dashboard(unittest.TestCase):
    def test_every_panel_query_returns_series_from_a_real_prometheus(self):
        with LocalCluster(workers=4, metrics=True) as cluster:
            prom = prometheus_server.PrometheusServer(cluster.metrics, cluster.dir)
            self.addCleanup(prom.close)
            data = os.path.join(cluster.dir, "tokens.bin")
            token_file(data)
            spec = {
                "name": "dashboard",
                "model": {"builtin": {"family": "gpt", "vocab": 32, "d_model": 8, "layers": 2,
                                      "heads": 2, "seq": 8, "seed": 1}},
                "split": {"stages": 2},
                "schedule": {"kind": "1F1B", "microbatches": 2},
                "placement": {"replicas": 2, "shard": "parameters"},
                "training": {"batch_size": 8, "steps": 30, "loss": "cross_entropy",
                             "grad_clip": {"max_norm": 1.0},
                             "lr_schedule": {"kind": "cosine", "warmup_steps": 2}},
                "data": {"kind": "tokens", "path": data, "eos": 31},
                "eval": {"every_steps": 5, "data": {"kind": "tokens", "path": data, "seed": 7,
                                                    "eos": 31}},
            }
            with cluster.client() as client:
                job = client.submit(spec)
                # While it runs, and after: the job's series and a failed call.
                with self.assertRaises(stagecoach.NotFound):
                    client.job("no-such-job")
                job.wait(timeout=300)
                queries = panel_queries()
                self.assertGreater(len(queries), 20)
                empty = queries
                deadline = time.monotonic() + 60
                while empty and time.monotonic() < deadline:
                    empty = [(t, q) for t, q in queries if not prom.query(q)]
                    time.sleep(1)
                self.assertEqual(empty, [], "panels whose queries Prometheus answers with no "
                                 "series:\n" + "\n".join(f"  {t}: {q}" for t, q in empty) +
                                 "\n" + prom.logs())


def firing(prom, alert: str, **labels) -> bool:
    return any(a["labels"].get("alertname") == alert and a["state"] == "firing"
               and all(a["labels"].get(k) == v for k, v in labels.items())
               for a in prom.alerts())


def wait_firing(prom, alert: str, timeout: float = 60.0, **labels) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if firing(prom, alert, **labels):
            return True
        time.sleep(0.5)
    return False


@unittest.skipUnless(prometheus_server.available(),
                     "the prometheus binary is missing (Debian's prometheus package; "
                     "scripts/test.sh installs it)")
class Alerts(unittest.TestCase):
    def test_the_rules_check_and_the_provoked_alerts_fire(self):
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        checked = subprocess.run([promtool, "check", "rules", ALERTS], capture_output=True,
                                 text=True, timeout=60)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
        self.assertIn("SUCCESS: 7 rules found", checked.stdout)

        # A short lease, so that a killed worker is lost within seconds, and a shorter stall
        # bound, so that a frozen one stalls its job well before.
        with LocalCluster(workers=3, metrics=True,
                          coordinator_args=["--lease", "10s", "--heartbeat-interval", "1s",
                                            "--stall-after", "2s"]) as cluster:
            with open(ALERTS) as f:
                rules = re.sub(r"\bfor: \S+", "for: 0s", f.read())
            rules_file = cluster.write_file("alerts.yaml", rules)
            prom = prometheus_server.PrometheusServer(cluster.metrics, cluster.dir, [rules_file])
            self.addCleanup(prom.close)
            self.assertEqual(len(prom.get("rules")["groups"][0]["rules"]), 7)
            with cluster.client() as client:
                # A non-finite step: a client batch of NaN on a paused job.
                job = client.submit({
                    "name": "nan", "model": {"builtin": {"family": "mlp",
                                                         "sizes": [8, 16, 4], "seed": 1}},
                    "split": {"stages": 2}, "schedule": {"kind": "1F1B", "microbatches": 2},
                    "training": {"batch_size": 8, "steps": 4, "loss": "mse"}}, paused=True)
                job.wait_for_state("PAUSED", timeout=120)
                x = np.full((8, 8), np.nan, dtype=np.float32)
                skipped = job.step(x, np.zeros((8, 4), np.float32))
                self.assertTrue(skipped.loss is None or math.isnan(skipped.loss))
                self.assertEqual(job.status().raw.skipped_steps, [0])
                self.assertTrue(wait_firing(prom, "StagecoachStepsSkipped", exported_job=job.id),
                                f"StagecoachStepsSkipped did not fire: {prom.alerts()}")
                self.assertFalse(firing(prom, "StagecoachWorkerLost"))
                job.cancel()
                self.provoke_a_stall(cluster, client, prom)
                # A worker lost: the idle third one killed.
                busy = {w.name for w in client.workers() if w.state != "IDLE"}
                cluster.kill_worker(2)
                self.assertTrue(wait_firing(prom, "StagecoachWorkerLost"),
                                f"StagecoachWorkerLost did not fire: {prom.alerts()}\n"
                                f"{cluster.logs()}")
                self.assertEqual({w.name for w in client.workers() if w.state == "LOST"},
                                 {"worker-2"}, busy)


    def provoke_a_stall(self, cluster, client, prom) -> None:
        """A frozen rank (SIGSTOP): the job is STALLED, its diagnosis names the rank, and
        StagecoachJobStalled fires; thawed, the job trains on."""
        job = client.submit({
            "name": "stall", "model": {"builtin": {"family": "mlp", "sizes": [8, 16, 4],
                                                   "seed": 1}},
            "split": {"stages": 2}, "schedule": {"kind": "1F1B", "microbatches": 2},
            "training": {"batch_size": 8, "steps": 1000000, "loss": "mse"}})
        deadline = time.monotonic() + 120
        while job.status().global_step < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        holder = next(w for w in client.workers() if w.job_id == job.id and w.rank == 0)
        frozen = int(holder.name.split("-")[1])
        cluster.freeze_worker(frozen)
        try:
            self.assertTrue(wait_firing(prom, "StagecoachJobStalled", timeout=30,
                                        exported_job=job.id),
                            f"StagecoachJobStalled did not fire: {prom.alerts()}\n"
                            f"{cluster.logs()}")
            diagnosis = job.diagnose()
            self.assertIsNotNone(diagnosis.stall)
            self.assertIn("silent for", diagnosis.stall.ranks[0].summary)
            self.assertIn(f"rank 0 ({holder.address})", diagnosis.stall.ranks[1].summary)
        finally:
            cluster.freeze_worker(frozen, False)
        at = job.status().global_step
        deadline = time.monotonic() + 60
        while job.status().global_step < at + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        # The condition ends on the coordinator's tick after the step completes.
        while job.diagnose().stall is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertIsNone(job.diagnose().stall, cluster.logs())
        job.cancel()


if __name__ == "__main__":
    unittest.main()
