#!/usr/bin/python3
"""Turns a user's PyTorch nn.Module into a TorchScript file Stagecoach can split, plus a starter
job spec.

    export_model.py MODULE:FACTORY --out model.pt [--spec-out job.yaml] [--input-shape 8,16]
                    [--input-dtype float32|int64] [--kwargs '{"hidden": 64}'] [--stages 2]
                    [--loss mse|cross_entropy]

MODULE is an importable module name (found from the current directory too) or a path to a .py
file; FACTORY is a class or function in it, called with --kwargs to build the module. The module
is scripted with torch.jit.script; when that fails it is traced with torch.jit.trace on a random
example input of --input-shape (and the tool says so: tracing freezes control flow). The saved
file is loaded back and must give the module's output on a random input (both in eval mode).

It prints the model's ordered top-level layers, the names split.points uses: for an
nn.Sequential its children, otherwise the submodule calls (prim::CallMethod) of the scripted
forward graph in order, with their parameter counts (a parameter of the top-level module itself
counts towards the layer whose part of the forward reads it first, as the workers count it). The
workers also open a call that wraps most of the model around a stack of blocks (a ViT's encoder)
into the blocks, and any call holding a nested split point; `stagectl inspect --upload model.pt`
lists the layers and every split point as the service sees them. --spec-out writes a starter
spec for `stagectl submit job.yaml --model model.pt`.

Runs with Debian's python3-torch (1.13). Exit codes: 0 success, 1 failure (import, scripting,
checking), 2 usage errors.
"""

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.stderr.write(f"export_model.py: cannot import torch ({e}); use a python3 with PyTorch, "
                     "e.g. Debian's /usr/bin/python3 with python3-torch\n")
    sys.exit(1)


class ExportError(Exception):
    """A failure the user can fix; its message says what and where."""


def parse_shape(text):
    try:
        shape = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape: expected integers like 8,16, got '{text}'")
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(
            f"--input-shape: expected positive integers like 8,16, got '{text}'")
    return shape


def parse_kwargs(text):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--kwargs: not valid JSON ({e})")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--kwargs: expected a JSON object like '{\"hidden\": 64}'")
    return value


def load_factory(target):
    """Imports MODULE and returns its attribute FACTORY."""
    if ":" not in target:
        raise ExportError(f"'{target}': expected MODULE:FACTORY, e.g. my_models:Net")
    module_name, factory_name = target.rsplit(":", 1)
    if not module_name or not factory_name:
        raise ExportError(f"'{target}': expected MODULE:FACTORY, e.g. my_models:Net")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise ExportError(f"module file '{module_name}' does not exist")
            sys.path.insert(0, os.path.dirname(path))
            name = os.path.splitext(os.path.basename(path))[0]
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"cannot import '{module_name}': {type(e).__name__}: {e}")
    factory = getattr(module, factory_name, None)
    if factory is None:
        public = sorted(n for n in dir(module) if not n.startswith("_"))
        raise ExportError(f"'{module_name}' has no '{factory_name}' (it has: {', '.join(public)})")
    return factory


def build_module(factory, kwargs, target):
    try:
        module = factory(**kwargs)
    except Exception as e:
        raise ExportError(f"{target}(**{kwargs}) raised {type(e).__name__}: {e}")
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{target} returned a {type(module).__name__}, not a torch.nn.Module")
    return module


def example_input(shape, dtype, high):
    if dtype == "int64":
        return torch.randint(0, high, shape, dtype=torch.int64)
    return torch.randn(shape, dtype=torch.float32)


def to_torchscript(module, shape, dtype, high):
    """Scripts the module, or traces it when scripting fails. Returns (scripted, how)."""
    try:
        return torch.jit.script(module), "scripted"
    except Exception as e:
        first = str(e).strip().splitlines()
        reason = first[0] if first else type(e).__name__
        if shape is None:
            raise ExportError(
                f"torch.jit.script failed ({reason}); pass --input-shape so that the module can "
                "be traced instead")
        sys.stderr.write(
            f"note: torch.jit.script failed ({reason});\n"
            f"      tracing with torch.jit.trace on an example input of shape {shape} instead: "
            "control flow that depends on the input is frozen as the example took it\n")
    try:
        with torch.no_grad():
            return torch.jit.trace(module, example_input(shape, dtype, high)), "traced"
    except Exception as e:
        raise ExportError(f"torch.jit.trace failed too: {type(e).__name__}: {e}")


def forward_graph_layers(scripted, direct_params):
    """The submodules the top-level forward calls, in graph order, by qualified name, and the
    top-level parameters each layer owns: a parameter of the module itself belongs to the layer
    whose part of the graph (from its call up to the next layer's call; the first layer's part
    also holds what comes before it) reads it first, as the workers count it."""
    graph = scripted.graph
    self_value = next(iter(graph.inputs()))
    names = {self_value.unique(): ""}  # value id -> qualified submodule name ("" = self)
    calls = []
    owned = {}  # top-level parameter name -> index of the layer that owns it

    def visit(block):
        for node in block.nodes():
            kind = node.kind()
            if kind == "prim::GetAttr":
                owner = node.inputsAt(0).unique()
                if owner in names:
                    attr = node.s("name")
                    names[node.output().unique()] = (
                        f"{names[owner]}.{attr}" if names[owner] else attr)
                    if names[owner] == "" and attr in direct_params and attr not in owned:
                        owned[attr] = max(len(calls) - 1, 0)
            elif kind == "prim::CallMethod" and node.s("name") == "forward":
                target = node.inputsAt(0).unique()
                if target in names and names[target]:
                    calls.append(names[target])
            for sub in node.blocks():
                visit(sub)

    visit(graph)
    return calls, owned


def top_level_layers(module, scripted):
    """[(name, parameters)] of the model's layers, in forward order."""
    direct = {name: p.numel() for name, p in module.named_parameters(recurse=False)}
    if isinstance(module, torch.nn.Sequential):
        names, owned = [name for name, _ in module.named_children()], {}
    else:
        names, owned = forward_graph_layers(scripted, direct)
    modules = dict(module.named_modules())
    layers = []
    for i, name in enumerate(names):
        sub = modules.get(name)
        count = sum(p.numel() for p in sub.parameters()) if sub is not None else 0
        count += sum(direct[p] for p, layer in owned.items() if layer == i)
        layers.append((name, count))
    return layers


def check_saved(module, path, shape, dtype, high):
    """Loads the saved file and compares its output with the module's on a random input."""
    try:
        loaded = torch.jit.load(path)
    except Exception as e:
        raise ExportError(f"the saved file '{path}' does not load: {e}")
    if shape is None:
        raise ExportError(
            "pass --input-shape (e.g. 8,16) so that the saved model's output can be checked "
            "against the module's")
    x = example_input(shape, dtype, high)
    was_training = module.training
    module.eval()
    loaded.eval()
    try:
        with torch.no_grad():
            want = module(x)
            got = loaded(x)
    except Exception as e:
        raise ExportError(f"running the model on a random input of shape {shape} failed: {e}")
    finally:
        module.train(was_training)
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        raise ExportError(
            f"the model's forward must return one tensor, got {type(want).__name__}")
    if want.shape != got.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        diff = (got - want).abs().max().item() if want.shape == got.shape else "shape"
        raise ExportError(f"the saved model's output differs from the module's ({diff})")
    return tuple(want.shape)


def spec_name(factory_name):
    name = re.sub(r"[^a-z0-9]+", "-", re.sub(r"(?<!^)(?=[A-Z])", "-", factory_name).lower())
    name = name.strip("-")[:63].strip("-")
    return name or "my-model"


def starter_spec(args, factory_name, layers, out_shape):
    """A commented starter job spec for the exported model."""
    n = len(layers)
    stages = max(1, min(args.stages, n))
    batch = args.input_shape[0] if args.input_shape else 8
    microbatches = max(1, min(4, batch))
    middle = layers[n // 2][0] if n >= 2 else (layers[0][0] if layers else "LAYER")
    layer_list = ", ".join(name for name, _ in layers)
    model_path = os.path.basename(args.out) if args.spec_out and os.path.dirname(
        os.path.abspath(args.out)) == os.path.dirname(os.path.abspath(args.spec_out)) else args.out
    return f"""# Starter spec for {factory_name}, written by tools/export_model.py.
# Submit with:  stagectl submit {os.path.basename(args.spec_out or 'job.yaml')} --model {args.out}
# (--model uploads the file to the coordinator and points model.torchscript at it).
# Layers ({n}), the names split.points uses: {layer_list}
name: {spec_name(factory_name)}
model:
  torchscript: {model_path}
split:
  stages: {stages}
  policy: equal-params           # equal-params | equal-layers | profiled
  # Or cut by name instead of `stages` (PyTorch's SplitPoint: the layer starts a new stage):
  # points: {{"{middle}": beginning}}
schedule:
  kind: 1F1B                     # GPipe | 1F1B | Interleaved1F1B | ZBVZeroBubble | ...
  microbatches: {microbatches}
placement:
  workers: {stages}
  device: cpu                    # cpu | cuda
training:
  batch_size: {batch}
  steps: 100
  loss: {args.loss}{'' if args.loss == 'cross_entropy' else '                      # mse | cross_entropy'}
  optimizer: {{kind: adamw, lr: 1.0e-3, weight_decay: 0.01}}
  # checkpoint: {{dir: /ckpt, every_steps: 50}}
data:
  kind: tensors                  # torch.save({{"inputs": X, "targets": Y}}, "data.pt")
  path: data.pt                  # inputs [N, {', '.join(str(d) for d in (args.input_shape or [batch])[1:]) or '...'}]; model output per row: {list(out_shape[1:]) if out_shape else '?'}
"""


def main(argv):
    parser = argparse.ArgumentParser(
        prog="export_model.py",
        description="Export a PyTorch nn.Module to TorchScript for Stagecoach, with a starter spec.")
    parser.add_argument("target", metavar="MODULE:FACTORY",
                        help="module name or .py path, and the class or function building the model")
    parser.add_argument("--out", required=True, help="TorchScript file to write (model.pt)")
    parser.add_argument("--spec-out", help="starter job spec (YAML) to write")
    parser.add_argument("--input-shape", type=parse_shape,
                        help="example input shape, batch first (e.g. 8,16): checks the saved "
                        "model and is the example for tracing")
    parser.add_argument("--input-dtype", choices=["float32", "int64"], default="float32",
                        help="example input element type (int64 for token ids)")
    parser.add_argument("--input-high", type=int, default=2,
                        help="int64 example inputs are drawn from [0, this) (e.g. the vocabulary)")
    parser.add_argument("--kwargs", type=parse_kwargs, default={},
                        help="JSON object of keyword arguments for FACTORY")
    parser.add_argument("--stages", type=int, default=2, help="split.stages of the starter spec")
    parser.add_argument("--loss", choices=["mse", "cross_entropy"], default="mse",
                        help="training.loss of the starter spec")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building")
    args = parser.parse_args(argv)
    if args.stages < 1:
        parser.error("--stages: must be >= 1")

    torch.manual_seed(args.seed)
    try:
        factory = load_factory(args.target)
        module = build_module(factory, args.kwargs, args.target)
        scripted, how = to_torchscript(module, args.input_shape, args.input_dtype,
                                       args.input_high)
        try:
            torch.jit.save(scripted, args.out)
        except Exception as e:
            raise ExportError(f"cannot write '{args.out}': {e}")
        out_shape = check_saved(module, args.out, args.input_shape, args.input_dtype,
                                args.input_high)
        layers = top_level_layers(module, scripted)
        if not layers:
            raise ExportError("the model's forward calls no submodule: there is nothing to split "
                              "into stages")
    except ExportError as e:
        sys.stderr.write(f"export_model.py: {e}\n")
        return 1

    total = sum(p.numel() for p in module.parameters())
    print(f"wrote {args.out} ({how}; output shape {list(out_shape)} for input "
          f"{args.input_shape}; the saved model gives the module's output)")
    print(f"{len(layers)} layers, {total} parameters:")
    width = max(len(name) for name, _ in layers)
    for i, (name, count) in enumerate(layers):
        print(f"  {i:3d}  {name:<{width}}  {count:>12d}")
    print("  (top-level calls: `stagectl inspect --upload " + args.out + "` lists the layers as the "
          "workers cut them, nested blocks and every split point included)")
    own = total - sum(count for _, count in layers)
    if own:
        print(f"  ({own} parameters of submodules that forward does not call, or of the "
              "top-level module that it does not read)")
    if args.spec_out:
        factory_name = args.target.rsplit(":", 1)[1]
        try:
            with open(args.spec_out, "w") as f:
                f.write(starter_spec(args, factory_name, layers, out_shape))
        except OSError as e:
            sys.stderr.write(f"export_model.py: cannot write '{args.spec_out}': {e}\n")
            return 1
        print(f"wrote {args.spec_out}: submit with "
              f"`stagectl submit {args.spec_out} --model {args.out}`")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
