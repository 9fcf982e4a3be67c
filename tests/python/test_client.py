"""The Python client (python/stagecoach) against a live local cluster of the build tree's daemons:
jobs submitted as dicts and watched to the end; pause, client batches of NumPy arrays, torch
tensors and ragged token rows (their losses equal `stagectl step` on the same batches of a twin
job), resume; inference and generation against stagectl's on the same model; every error class;
list_jobs following pages over 150 jobs."""

from __future__ import annotations

import copy
import json
import math
import os
import unittest

import numpy as np

import stagecoach
from local_cluster import LocalCluster

try:
    import torch
except ImportError:  # torch is optional for the client
    torch = None

MLP = {
    "name": "py-mlp",
    "model": {"builtin": {"family": "mlp", "sizes": [8, 16, 16, 4], "seed": 1}},
    "split": {"stages": 2},
    "schedule": {"kind": "1F1B", "microbatches": 2},
    "training": {"batch_size": 8, "steps": 4, "loss": "mse",
                 "optimizer": {"kind": "sgd", "lr": 0.05}},
}

GPT = {
    "name": "py-gpt",
    "model": {"builtin": {"family": "gpt", "vocab": 32, "d_model": 16, "layers": 2, "heads": 2,
                          "seq": 12, "seed": 3}},
    "split": {"stages": 2},
    "schedule": {"kind": "1F1B", "microbatches": 2},
    "training": {"batch_size": 4, "steps": 3, "loss": "cross_entropy",
                 "optimizer": {"kind": "sgd", "lr": 0.1}},
}

TIMEOUT = 120.0


def batch(seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((8, 8)).astype(np.float32),
            rng.standard_normal((8, 4)).astype(np.float32))


class ClusterTest(unittest.TestCase):
    workers = 2

    @classmethod
    def setUpClass(cls):
        cls.cluster = LocalCluster(workers=cls.workers)
        cls.client = cls.cluster.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()

    def run(self, result=None):
        # A failure shows the daemons' logs.
        outcome = super().run(result)
        if result is not None and (result.failures or result.errors):
            last = (result.failures + result.errors)[-1]
            if last[0] is self:
                print(self.cluster.logs())
        return outcome

    def paused(self, spec) -> stagecoach.Job:
        """A job of `spec` holding before its first step; cancelled after the test if it has
        not ended."""
        job = self.client.submit(spec, paused=True)
        self.addCleanup(self.end, job)
        job.wait_for_state("PAUSED", timeout=TIMEOUT)
        return job

    @staticmethod
    def end(job: stagecoach.Job) -> None:
        if not job.status().done:
            job.cancel("the test ended")


class SubmitAndWatch(ClusterTest):
    def test_a_dict_spec_trains_and_its_events_are_typed(self):
        job = self.client.submit(MLP)
        events = list(job.watch(timeout=TIMEOUT))
        states = [e.state for e in events if isinstance(e, stagecoach.StateChanged)]
        self.assertEqual(states[0], "PLANNING")
        self.assertIn("RUNNING", states)
        self.assertEqual(states[-1], "SUCCEEDED")
        steps = [e for e in events if isinstance(e, stagecoach.StepCompleted)]
        self.assertEqual([s.global_step for s in steps], [0, 1, 2, 3])
        self.assertTrue(all(s.step_time > 0 and s.steps_total == 4 for s in steps))
        self.assertEqual([e.sequence for e in events], sorted(e.sequence for e in events))
        status = job.wait(timeout=TIMEOUT)
        self.assertEqual(status.state, "SUCCEEDED")
        self.assertEqual(status.global_step, 4)
        self.assertEqual(len(status.losses), 4)
        self.assertTrue(all(math.isfinite(l) for l in status.losses))
        self.assertEqual(status.losses, [s.loss for s in steps])
        self.assertEqual(status.schedule, "1F1B")
        # The same job from its id, and among the listed ones.
        self.assertEqual(self.client.job(job.id).status().losses, status.losses)
        self.assertIn(job.id, [j.id for j in self.client.list_jobs()])

    def test_a_yaml_file_and_yaml_text_submit_too(self):
        spec = dict(MLP, name="py-yaml", training=dict(MLP["training"], steps=1))
        path = self.cluster.write_file("spec.yaml", json.dumps(spec))
        for given in (path, json.dumps(spec)):
            status = self.client.submit(given).wait(timeout=TIMEOUT)
            self.assertEqual(status.name, "py-yaml")
            self.assertEqual(len(status.losses), 1)

    def test_wait_with_progress_and_a_cancelled_job_raises_job_failed(self):
        job = self.paused(dict(MLP, name="py-cancel"))
        job.cancel("enough")
        with self.assertRaises(stagecoach.JobFailed) as e:
            job.wait(timeout=TIMEOUT, progress=True)
        self.assertEqual(e.exception.status.state, "CANCELLED")
        self.assertEqual(job.wait(timeout=TIMEOUT, check=False).state, "CANCELLED")


class StepControl(ClusterTest):
    def test_client_batches_step_like_stagectl_step(self):
        # Job A through the client: a NumPy batch, then torch tensors (or NumPy again), then the
        # rest of its steps from its data.
        x1, y1 = batch(1)
        x2, y2 = batch(2)
        a = self.paused(MLP)
        first = a.step(x1, y1)
        second = a.step(torch.from_numpy(x2), torch.from_numpy(y2)) if torch else a.step(x2, y2)
        self.assertEqual((first.global_step, second.global_step), (0, 1))
        self.assertEqual(len(first.microbatch_losses), 2)
        self.assertAlmostEqual(first.loss, float(np.mean(first.microbatch_losses)), places=12)
        outputs = a.forward(torch.from_numpy(x1) if torch else x1)
        self.assertEqual(tuple(outputs.shape), (8, 4))
        if torch:
            self.assertIsInstance(outputs, torch.Tensor)
        self.assertEqual(a.run(1), 3)
        a.wait_for_state("PAUSED", timeout=TIMEOUT)
        a.resume()
        done = a.wait(timeout=TIMEOUT)
        self.assertEqual(done.global_step, 4)
        self.assertAlmostEqual(done.losses[0], first.loss, places=12)

        # Job B, the same spec, through stagectl on the same batches: the same losses.
        files = {}
        for name, array in (("x1", x1), ("y1", y1), ("x2", x2), ("y2", y2)):
            files[name] = os.path.join(self.cluster.dir, f"{name}.npy")
            np.save(files[name], array)
        b = self.paused(MLP)
        want1 = self.cluster.stagectl_json("step", b.id, "--inputs", files["x1"], "--targets",
                                           files["y1"])
        want2 = self.cluster.stagectl_json("step", b.id, "--inputs", files["x2"], "--targets",
                                           files["y2"])
        b.cancel()
        self.assertEqual(first.loss, want1["loss"])
        self.assertEqual(first.microbatch_losses, want1["microbatch_losses"])
        self.assertEqual(second.loss, want2["loss"])

    def test_ragged_token_rows_step_like_stagectl_step_on_jsonl(self):
        rows = [[1, 5, 7, 2, 9, 4], [3, 3], [8, 1, 1, 6], [2, 30, 4]]
        a = self.paused(GPT)
        got = a.step([np.array(r) for r in rows])  # documents: targets are the next tokens
        a.cancel()
        path = self.cluster.write_file("rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        b = self.paused(GPT)
        want = self.cluster.stagectl_json("step", b.id, "--inputs", path)
        b.cancel()
        self.assertEqual(got.loss, want["loss"])
        self.assertEqual(got.microbatch_losses, want["microbatch_losses"])

    def test_checkpoint_of_a_paused_job(self):
        spec = copy.deepcopy(MLP)
        spec["training"]["checkpoint"] = {"dir": os.path.join(self.cluster.dir, "ckpt")}
        job = self.paused(spec)
        step, directory = job.checkpoint()
        self.assertEqual(step, 0)
        self.assertTrue(directory.startswith(os.path.join(self.cluster.dir, "ckpt")))
        job.cancel()


class InferAndGenerate(ClusterTest):
    def test_infer_equals_stagectl_infer(self):
        x = np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)
        got = self.client.infer(MLP, x, timeout=TIMEOUT)
        self.assertEqual(got.shape, (6, 4))
        self.assertEqual(got.dtype, np.float32)
        spec = self.cluster.write_file("infer.yaml", json.dumps(MLP))
        inputs = os.path.join(self.cluster.dir, "infer.npy")
        np.save(inputs, x)
        want = self.cluster.stagectl_json("infer", spec, "--inputs", inputs)
        np.testing.assert_allclose(got, np.array(want["values"], dtype=np.float32), rtol=1e-6)
        if torch:
            self.assertIsInstance(self.client.infer(MLP, torch.from_numpy(x)), torch.Tensor)

    def test_generate_streams_what_stagectl_generates(self):
        job = self.paused(GPT)
        got = list(job.generate([1, 2, 3], tokens=8))
        want = self.cluster.stagectl_json("generate", job.id, "--prompt-ids", "1 2 3",
                                          "--tokens", "8", "--temperature", "0")
        self.assertEqual(got, want["tokens"])
        # Several prompts decode together, a row each; text through a tokenizer.
        rows = list(job.generate([[1, 2, 3], [4, 5]], tokens=4))
        self.assertEqual([r[0] for r in rows], got[:4])
        vocab = stagecoach.CharVocabulary([chr(ord("a") + i) for i in range(26)] + list(".,;:!?"))
        text = "".join(job.generate(vocab.decode([1, 2, 3]), tokens=8, tokenizer=vocab))
        self.assertEqual(text, vocab.decode(got))
        job.cancel()


class Errors(ClusterTest):
    def test_each_failure_has_its_class_and_the_servers_message(self):
        bad = copy.deepcopy(MLP)
        bad["training"]["batch_size"] = 0
        with self.assertRaises(stagecoach.InvalidSpec) as e:
            self.client.submit(bad)
        self.assertIn("training.batch_size", e.exception.message)
        self.assertEqual(e.exception.call, "SubmitJob")
        self.assertIsInstance(e.exception, stagecoach.InvalidArgument)
        with self.assertRaises(stagecoach.NotFound):
            self.client.job("no-such-job")
        job = self.paused(MLP)
        with self.assertRaises(stagecoach.InvalidArgument) as e:
            job.step(np.zeros((8, 3), np.float32), np.zeros((8, 4), np.float32))
        self.assertIn("inputs", e.exception.message)
        job.resume()
        with self.assertRaises(stagecoach.FailedPrecondition):  # RUNNING, or already ended
            job.step(*batch(1))
        self.assertEqual(job.wait(timeout=TIMEOUT).state, "SUCCEEDED")
        with self.assertRaises(stagecoach.FailedPrecondition):  # it has ended
            job.cancel()
        with self.assertRaises(stagecoach.InvalidArgument) as e:
            job.step([[1, 2], [3]], None)  # a document of one token has no target
        self.assertIn("at least 2 tokens", e.exception.message)
        with self.assertRaises(stagecoach.StagecoachError) as e:
            self.client.submit(os.path.join(self.cluster.dir, "missing.yaml"))
        self.assertIn("cannot read", e.exception.message)

    def test_an_unreachable_coordinator_is_unavailable_within_the_deadline(self):
        with stagecoach.Client("127.0.0.1:1", timeout=2.0) as client:
            with self.assertRaises((stagecoach.Unavailable, stagecoach.DeadlineExceeded)):
                client.workers()


class Tokens(unittest.TestCase):
    def test_a_wrong_or_missing_token_is_unauthenticated(self):
        with LocalCluster(workers=1, client_token="s3cret") as cluster:
            for kwargs in ({}, {"token": "wrong"}):
                with cluster.client(**kwargs) as client:
                    with self.assertRaises(stagecoach.Unauthenticated):
                        client.workers()
            token_file = cluster.write_file("token", "s3cret\n")
            with cluster.client(token_file=token_file) as client:
                self.assertEqual(len(client.workers()), 1)


class Paging(ClusterTest):
    workers = 1

    def test_list_jobs_follows_the_pages_over_150_jobs(self):
        spec = dict(MLP, split={"stages": 1}, name="py-page")
        ids = []
        for _ in range(150):
            job = self.client.submit(spec, paused=True)
            job.cancel()
            ids.append(job.id)
        listed = [j.id for j in self.client.list_jobs(page_size=40)]
        self.assertEqual([i for i in listed if i in set(ids)], ids)
        self.assertEqual(len(listed), len(set(listed)))


class Offline(unittest.TestCase):
    """What needs no cluster: specs, tensors, vocabularies."""

    def test_tensors_round_trip_and_bad_ones_are_named(self):
        from stagecoach import tensors

        for array in (np.arange(12, dtype=np.float32).reshape(3, 4),
                      np.arange(6, dtype=np.int64).reshape(6, 1), np.array([1, 2], np.int32)):
            back = tensors.from_tensor_data(tensors.to_tensor_data(array, "x"))
            np.testing.assert_array_equal(back, array)
            self.assertEqual(back.dtype, array.dtype)
        with self.assertRaisesRegex(stagecoach.InvalidArgument, "x: expected at least one"):
            tensors.to_tensor_data(np.float32(1), "x")
        with self.assertRaisesRegex(stagecoach.InvalidArgument, "x: expected numbers"):
            tensors.to_tensor_data(np.array(["a"]), "x")
        padded, targets, lengths = tensors.pad_rows([[1, 2, 3], [4]], [[2, 3, 4], [5]])
        np.testing.assert_array_equal(padded, [[1, 2, 3], [4, 0, 0]])
        np.testing.assert_array_equal(targets, [[2, 3, 4], [5, -100, -100]])
        self.assertEqual(lengths, [3, 1])
        with self.assertRaisesRegex(stagecoach.InvalidArgument, "targets row 1: 2 targets for 1"):
            tensors.pad_rows([[1, 2, 3], [4]], [[2, 3, 4], [5, 6]])
        self.assertTrue(tensors.is_ragged([[1, 2], [3]]))
        self.assertFalse(tensors.is_ragged([[1, 2], [3, 4]]))

    def test_char_vocabulary(self):
        vocab = stagecoach.CharVocabulary(list("abc "))
        self.assertEqual(vocab.encode("a cab"), [0, 3, 2, 0, 1])
        self.assertEqual(vocab.decode([2, 0, 1]), "cab")
        with self.assertRaisesRegex(stagecoach.InvalidArgument, "column 2: 'x'"):
            vocab.encode("ax")
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"vocab-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"format": "stagecoach-chars", "version": 1, "chars": list("xy")}, f)
        try:
            self.assertEqual(stagecoach.CharVocabulary.load(path).decode([1, 0]), "yx")
        finally:
            os.remove(path)

    def test_a_spec_that_is_not_a_dict_path_or_text_is_refused(self):
        with self.assertRaisesRegex(stagecoach.StagecoachError, "spec: expected a dict"):
            stagecoach.Client("127.0.0.1:1").submit(42)


if __name__ == "__main__":
    unittest.main()
