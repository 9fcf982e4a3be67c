"""TorchScript fixtures for the worker's TorchScript model loader (worker/model/torchscript_model.h).

Usage: /usr/bin/python3 make_models.py OUT_DIR [--bench]

Writes, with torch.jit.script and torch.jit.save, each model built from a fixed seed:
  sequential.pt  nn.Sequential of 8 layers, 16 -> 4 (sequential).
  skip.pt        SkipNet: 6 layers a..f; h0 = a(x) is added to e's output, so a 3-way cut at
                 [0, 2, 4] sends it from stage 0 straight to stage 2; x is used by stage 1; a
                 top-level parameter `scale` is read after e's call.
  heavy.pt       nn.Sequential of 6 layers where layer 2 (two 512x512 Linears) outweighs the rest.
  blocks.pt      BlocksNet: embed, an nn.ModuleList of 3 residual blocks looped over, head; the
                 batch size x.size(0) crosses from stage 0 to the last stage (not a tensor).
  branchy.pt     BranchyNet: a, then b or c inside an `if`, then d; no cut may separate b from c.
  shared.pt      SharedNet: a, b, then a again (weight sharing): no cut may separate the calls.
  nolayer.pt     NoLayerNet: a forward that calls no submodule (refused: no layer).
  gated.pt       GatedNet: embed, body (three Blocks, most of the parameters, called inside an
                 `if`), head: the body is not opened into its blocks (control flow).
  helper.pt      HelperNet: forward calls a, then a helper method that calls b and c; a top-level
                 parameter `bias` is read after a and again after b (stage 0 passes it on).
  state_dict.pt  torch.save of sequential.pt's state_dict: not TorchScript (refused).

With --bench it also writes the models of bench/model_bench.cc and bench/peer_bench.cc (seed 0;
the first two of input width 1024, about 8.4M parameters each):
  bench_mlp.pt   nn.Sequential of 8 Linear(1024, 1024) + ReLU pairs (16 layers, sequential).
  bench_skip.pt  BenchSkipNet: 8 Blocks of 1024; cut at equal layer counts into 4 stages
                 ([0, 2, 4, 6]) stage 0's output reaches stage 2 directly (across two
                 boundaries) and stage 1's reaches stage 3.
  bench_tiny_mlp.pt  bench_mlp.pt at width 16 (the runtimes' per-step overhead).

The nn.Module classes are importable (`from make_models import SkipNet`) for Python reference
checks; make(name) builds the seeded eager module saved as a file name.
"""

import os
import sys

import torch
from torch import nn


class Block(nn.Module):
    """Linear then ReLU."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Heavy(nn.Module):
    """16 -> 512 -> 512 -> 512 -> 16: far heavier than the other layers of heavy.pt."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 512)
        self.mid = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        self.down = nn.Linear(512, 16)

    def forward(self, x):
        return self.down(self.mid(torch.relu(self.up(x))))


def sequential_net() -> nn.Sequential:
    """8 layers: "0" .. "7"."""
    return nn.Sequential(
        nn.Linear(16, 32),
        nn.ReLU(),
        Block(32, 32),
        Block(32, 32),
        nn.Linear(32, 32),
        nn.Tanh(),
        Block(32, 24),
        nn.Linear(24, 4),
    )


def heavy_net() -> nn.Sequential:
    """6 layers; layer "2" holds almost all parameters."""
    return nn.Sequential(
        nn.Linear(16, 16), nn.ReLU(), Heavy(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


class SkipNet(nn.Module):
    """Not a chain: h0 skips from layer a past b, c, d to e's output; x itself feeds d."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = Block(32, 32)
        self.c = Block(32, 32)
        self.d = nn.Linear(32, 32)
        self.e = Block(32, 32)
        self.f = nn.Linear(32, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 32))

    def forward(self, x):
        h0 = self.a(x)
        h1 = self.b(h0)
        h2 = self.c(h1)
        h3 = self.d(h2 + x.sum(1, keepdim=True))
        h4 = self.e(h3) + h0
        return self.f(h4 * self.scale)


class BlocksNet(nn.Module):
    """embed, blocks.0 .. blocks.2 (residual), head; the output is reshaped by x.size(0)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(16, 16) for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        n = x.size(0)
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h).reshape(n, -1)


class BranchyNet(nn.Module):
    """b or c depending on the sign of the sum: a cut between b and c falls inside the if."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)
        self.d = nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        if bool(h.sum() > 0):
            h = self.b(h)
        else:
            h = self.c(h)
        return self.d(h)


class SharedNet(nn.Module):
    """Calls a twice (before and after b): a cut between them is refused."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(self.b(self.a(x)))


class NoLayerNet(nn.Module):
    """A parameter but no submodule call."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w


class HelperNet(nn.Module):
    """Layers called from a helper method; a top-level parameter used by two stages."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 4)
        self.bias = nn.Parameter(torch.full((8,), 0.1))

    def tail(self, h):
        return self.c(torch.tanh(self.b(h)) + self.bias)

    def forward(self, x):
        h = self.a(x) + self.bias
        return self.tail(h)


class GatedBody(nn.Module):
    """A stack of blocks that runs only for inputs of positive sum."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(16, 16) for _ in range(3)])

    def forward(self, x):
        if bool(x.sum() > 0):
            for block in self.blocks:
                x = block(x)
        return x


class GatedNet(nn.Module):
    """embed, body, head: body holds most of the parameters but calls its blocks in an if."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.body = GatedBody()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.body(self.embed(x)))


BUILDERS = {
    "sequential.pt": sequential_net,
    "skip.pt": SkipNet,
    "heavy.pt": heavy_net,
    "blocks.pt": BlocksNet,
    "branchy.pt": BranchyNet,
    "shared.pt": SharedNet,
    "nolayer.pt": NoLayerNet,
    "helper.pt": HelperNet,
    "gated.pt": GatedNet,
}


def bench_mlp_net() -> nn.Sequential:
    """16 layers: Linear(1024, 1024) "0", ReLU "1", ..., ReLU "15"."""
    layers = []
    for _ in range(8):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers)


def bench_tiny_mlp_net() -> nn.Sequential:
    """bench_mlp.pt's 16 layers at width 16: a step costs little compute, so its time is the
    runtime's own per-step overhead (bench/peer_bench.cc --model)."""
    layers = []
    for _ in range(8):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers)


class BenchSkipNet(nn.Module):
    """8 Blocks of 1024 (a..h) with two skips, each across two stage boundaries at [0, 2, 4, 6]:
    b's output is added to e's, and d's output to g's."""

    def __init__(self):
        super().__init__()
        self.a = Block(1024, 1024)
        self.b = Block(1024, 1024)
        self.c = Block(1024, 1024)
        self.d = Block(1024, 1024)
        self.e = Block(1024, 1024)
        self.f = Block(1024, 1024)
        self.g = Block(1024, 1024)
        self.h = Block(1024, 1024)

    def forward(self, x):
        s0 = self.b(self.a(x))
        s1 = self.d(self.c(s0))
        h = self.f(self.e(s1) + s0)
        return self.h(self.g(h) + s1)


BENCH_BUILDERS = {
    "bench_mlp.pt": bench_mlp_net,
    "bench_skip.pt": BenchSkipNet,
    "bench_tiny_mlp.pt": bench_tiny_mlp_net,
}


def make(name: str) -> nn.Module:
    """The eager module saved as `name`, built from seed 0."""
    torch.manual_seed(0)
    return {**BUILDERS, **BENCH_BUILDERS}[name]()


def main() -> None:
    args = sys.argv[1:]
    bench = "--bench" in args
    args = [a for a in args if a != "--bench"]
    if len(args) != 1:
        sys.exit("usage: make_models.py OUT_DIR [--bench]")
    out = args[0]
    os.makedirs(out, exist_ok=True)
    for name in BUILDERS:
        torch.jit.save(torch.jit.script(make(name)), os.path.join(out, name))
    torch.save(make("sequential.pt").state_dict(), os.path.join(out, "state_dict.pt"))
    if bench:
        for name in BENCH_BUILDERS:
            torch.jit.save(torch.jit.script(make(name)), os.path.join(out, name))


if __name__ == "__main__":
    main()
