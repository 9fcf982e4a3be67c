"""The Grafana dashboard proven against a real Prometheus: Debian's `prometheus` scrapes a live
cluster (a coordinator and 4 workers) running a 2-replica GPT job on packed token data with the
training recipe on (clipping, a learning-rate schedule, eval passes), and every query of every
panel of deploy/grafana/stagecoach-dashboard.json, evaluated through Prometheus's HTTP API, returns
at least one series. Panels whose data needs an event get it: a failed call for the RPC errors.
Skipped where the prometheus binary is missing (scripts/test.sh installs it)."""

from __future__ import annotations

import json
import os
import time
import unittest

import numpy as np

import prometheus_server
import stagecoach
from local_cluster import LocalCluster

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(SOURCE, "deploy", "grafana", "stagecoach-dashboard.json")

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
                "placement": {"replicas": 2},
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


if __name__ == "__main__":
    unittest.main()
