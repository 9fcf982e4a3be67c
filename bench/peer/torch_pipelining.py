"""The PyTorch side of bench/peer_bench.cc: one job run by torch.distributed.pipelining.

Runs in any Python with PyTorch >= 2.4 and gloo (bench/peer_bench.cc runs it in the Debian 13
chroot of scripts/trixie_chroot.sh). Two commands:

  torch_pipelining.py data --model M.pt --rows N --seed S --out DATA.pt
      writes {"inputs": X [N, in], "targets": Y [N, out]} (float32 normal) for the MLP in M.pt,
      the file both runtimes train on (Stagecoach reads it as `data: {kind: tensors}`).
  torch_pipelining.py run --model M.pt --data DATA.pt --schedule NAME --mode shipped|workarounds
      trains M.pt's layers (a TorchScript nn.Sequential of Linear and ReLU, rebuilt as eager
      modules with its weights) for --steps steps on --world ranks over gloo, one process each,
      and prints one JSON line: per-rank step times, losses, thread counts, gradient scaling.

Step k trains on rows (k * batch + i) mod N, i < batch, as Stagecoach's tensors data does; the
loss is mse; the optimizer SGD. A step's time on a rank is from the start of schedule.step() to
the end of its optimizer step, with no barrier in between (a barrier before the first step only).

--mode shipped runs PyTorch as it ships. --mode workarounds changes three things, and the JSON
says so: (1) _batch_p2p waits on every work batch_isend_irecv returns instead of the last one
(PyTorch issue #132644, fixed upstream by PR #152938; without it 1F1B and the multi-stage
schedules hang on gloo); (2) the multi-stage schedules run their action lists through
_PipelineScheduleRuntime, which sends nothing to its own rank (ZBVZeroBubble's V turn); (3) the
loss is divided by the microbatch count, so gradients are the mean over microbatches (2.4-2.6
have no scale_grads and leave the sum; Stagecoach's training.scale_grads, default true, means).
"""
import argparse
import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")


def eager_layers(path):
    """The TorchScript Sequential's layers as eager modules with its weights."""
    scripted = torch.jit.load(path)
    layers = []
    for name, child in scripted.named_children():
        kind = child.original_name
        if kind == "Linear":
            w = child.weight.detach()
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=hasattr(child, "bias"))
            with torch.no_grad():
                lin.weight.copy_(w)
                if lin.bias is not None:
                    lin.bias.copy_(child.bias.detach())
            layers.append(lin)
        elif kind == "ReLU":
            layers.append(torch.nn.ReLU())
        else:
            sys.exit(f"{path}: layer {name} is a {kind}; the peer benchmark takes Linear and ReLU")
    if not layers or not isinstance(layers[0], torch.nn.Linear):
        sys.exit(f"{path}: expected a Sequential starting with a Linear")
    return layers


def write_data(a):
    layers = eager_layers(a.model)
    linears = [l for l in layers if isinstance(l, torch.nn.Linear)]
    g = torch.Generator().manual_seed(a.seed)
    x = torch.randn(a.rows, linears[0].in_features, generator=g)
    y = torch.randn(a.rows, linears[-1].out_features, generator=g)
    torch.save({"inputs": x, "targets": y}, a.out)


class WaitAll:
    """What _batch_p2p returns with the workaround: a work whose wait() waits on all of them."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()


def batch_p2p_waiting_all(p2p_ops, desc=None):
    if len(p2p_ops) == 0:
        return None
    return WaitAll(dist.batch_isend_irecv(p2p_ops))


def stage_placement(schedule, rank, world, multi):
    """This rank's stage indices and every stage's rank (loop, or V for the V schedules)."""
    if not multi:
        return [rank], {s: s for s in range(world)}
    stages = 2 * world
    if schedule in V_SCHEDULES:
        owner = {s: (s if s < world else stages - 1 - s) for s in range(stages)}
    else:
        owner = {s: s % world for s in range(stages)}
    return [s for s in range(stages) if owner[s] == rank], owner


def build_schedule(a, rank, sched, stages_on_rank, owner, loss_fn):
    cls = sched.get_schedule_class(a.schedule)
    if len(stages_on_rank) == 1 and not issubclass(cls, sched.PipelineScheduleMulti):
        return cls(stages_on_rank[0], n_microbatches=a.microbatches, loss_fn=loss_fn)
    # Loop placement is the stages' default; only the V schedules take their placement.
    placement = {"stage_index_to_group_rank": owner} if a.schedule in V_SCHEDULES else {}
    schedule = cls(stages_on_rank, n_microbatches=a.microbatches, loss_fn=loss_fn, **placement)
    if a.mode == "workarounds":
        runtime = sched._PipelineScheduleRuntime(stages_on_rank, n_microbatches=a.microbatches,
                                                 loss_fn=loss_fn, stage_index_to_group_rank=owner)
        runtime._load_actions(schedule.pipeline_order)
        return runtime
    return schedule


def run_rank(rank, a, port, out):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(a.threads)
        import datetime
        dist.init_process_group("gloo", rank=rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=a.timeout))
        import torch.distributed.pipelining.schedules as sched
        from torch.distributed.pipelining import PipelineStage
        if a.mode == "workarounds":
            sched._batch_p2p = batch_p2p_waiting_all
        multi = issubclass(sched.get_schedule_class(a.schedule), sched.PipelineScheduleMulti)
        stage_ids, owner = stage_placement(a.schedule, rank, a.world, multi)
        num_stages = len(owner)
        layers = eager_layers(a.model)
        if len(layers) % num_stages:
            raise ValueError(f"{len(layers)} layers do not split evenly into {num_stages} stages")
        per = len(layers) // num_stages
        data = torch.load(a.data)
        x_all, y_all = data["inputs"].float(), data["targets"].float()
        mb = a.batch // a.microbatches
        stages = []
        for s in stage_ids:
            sub = torch.nn.Sequential(*layers[s * per:(s + 1) * per])
            before = [l for l in layers[:s * per] if isinstance(l, torch.nn.Linear)]
            in_width = before[-1].out_features if before else x_all.shape[1]
            out_width = [l for l in layers[:(s + 1) * per]
                         if isinstance(l, torch.nn.Linear)][-1].out_features
            stages.append(PipelineStage(sub, s, num_stages, torch.device("cpu"),
                                        input_args=torch.zeros(mb, in_width),
                                        output_args=torch.zeros(mb, out_width)))
        scale = a.microbatches if a.mode == "workarounds" else 1
        loss_fn = lambda out, tgt: torch.nn.functional.mse_loss(out, tgt) / scale
        schedule = build_schedule(a, rank, sched, stages, owner, loss_fn)
        params = [p for st in stages for p in st.submod.parameters()]
        opt = torch.optim.SGD(params, lr=a.lr)
        has_first, has_last = 0 in stage_ids, num_stages - 1 in stage_ids
        n = x_all.shape[0]
        times, losses = [], []
        dist.barrier()
        for step in range(a.steps):
            rows = torch.arange(step * a.batch, (step + 1) * a.batch) % n
            x, y = x_all[rows], y_all[rows]
            t0 = time.perf_counter()
            opt.zero_grad()
            mb_losses = [] if has_last else None
            schedule.step(*((x,) if has_first else ()), target=y if has_last else None,
                          losses=mb_losses)
            opt.step()
            times.append(time.perf_counter() - t0)
            if has_last:
                losses.append(sum(float(l) for l in mb_losses) * scale / a.microbatches)
        result = {"rank": rank, "times": times, "threads": torch.get_num_threads()}
        if has_last:
            result["losses"] = losses
        out.put(result)
        dist.destroy_process_group()
    except Exception as e:  # reported to the parent, which prints it as the run's error
        out.put({"rank": rank, "error": f"{type(e).__name__}: {e}".splitlines()[0][:400],
                 "traceback": traceback.format_exc()[-2000:]})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(r, a, port, q), daemon=True)
             for r in range(a.world)]
    for p in procs:
        p.start()
    result = {"schedule": a.schedule, "torch": torch.__version__, "mode": a.mode,
              "grad_scaling": "mean (loss / microbatches)" if a.mode == "workarounds"
              else "sum over microbatches (no scale_grads)",
              "workarounds": ["_batch_p2p waits on every work (#132644)",
                              "multi-stage lists through _PipelineScheduleRuntime",
                              "loss / microbatches"] if a.mode == "workarounds" else [],
              "rank_times": {}, "threads": {}}
    deadline = time.monotonic() + a.timeout
    import queue as queue_module
    for _ in range(a.world):
        try:
            r = q.get(timeout=max(1.0, deadline - time.monotonic()))
        except queue_module.Empty:
            result["error"] = f"no result from every rank within {a.timeout} s (hung)"
            break
        if "error" in r:
            result["error"] = f"rank {r['rank']}: {r['error']}"
            result["traceback"] = r["traceback"]
            break
        result["rank_times"][str(r["rank"])] = r["times"]
        result["threads"][str(r["rank"])] = r["threads"]
        if "losses" in r:
            result["losses"] = r["losses"]
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    print(json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data")
    d.add_argument("--model", required=True)
    d.add_argument("--rows", type=int, required=True)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--schedule", required=True)
    r.add_argument("--mode", choices=["shipped", "workarounds"], required=True)
    r.add_argument("--batch", type=int, default=256)
    r.add_argument("--microbatches", type=int, default=8)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--lr", type=float, default=0.01)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--world", type=int, default=2)
    r.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    if a.command == "data":
        write_data(a)
    else:
        run(a)


if __name__ == "__main__":
    main()
