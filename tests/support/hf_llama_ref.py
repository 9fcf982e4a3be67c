#!/usr/bin/python3
"""Writes a Llama-family Hugging Face checkpoint directory for the tests, as transformers'
save_pretrained lays one out (config.json, model.safetensors or model-0000i-of-0000N shards and
model.safetensors.index.json), with the standard library only and safetensors_ref.py's
independent reading of the format. Tensor names and shapes follow transformers' modeling files
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM); nothing is shared with Stagecoach.

  hf_llama_ref.py write DIR CONFIG_JSON [--seed S] [--dtype F32|BF16] [--shards N]
                  [--drop NAME] [--extra NAME] [--reshape NAME]
      CONFIG_JSON is config.json's text. Values: Python's random.Random(S).gauss(0, 0.02) for
      every weight and bias, 1 + gauss(0, 0.1) for norm weights, drawn in the order of the names
      sorted; BF16 keeps a float32's upper half. --drop leaves a tensor out, --extra adds one
      [4] tensor, --reshape gives a tensor one row more (all for refusal tests).
  hf_llama_ref.py values DIR NAME
      prints a stored tensor's values, one per line (F32, BF16, F16).
"""
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402


def tensors(c):
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads)
    mt = c["model_type"]
    hd = c.get("head_dim", 128 if mt == "qwen3" else h // heads)
    inter = c["intermediate_size"]
    qkv_bias = mt == "qwen2" or (mt in ("llama", "qwen3") and c.get("attention_bias", False))
    o_bias = mt in ("llama", "qwen3") and c.get("attention_bias", False)
    out = [("model.embed_tokens.weight", [c["vocab_size"], h]), ("model.norm.weight", [h])]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
        for name, rows, cols, bias in (("q_proj", heads * hd, h, qkv_bias),
                                       ("k_proj", kv * hd, h, qkv_bias),
                                       ("v_proj", kv * hd, h, qkv_bias),
                                       ("o_proj", h, heads * hd, o_bias)):
            out.append((p + "self_attn.%s.weight" % name, [rows, cols]))
            if bias:
                out.append((p + "self_attn.%s.bias" % name, [rows]))
        if mt == "qwen3":
            out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        for name, rows, cols in (("gate_proj", inter, h), ("up_proj", inter, h),
                                 ("down_proj", h, inter)):
            out.append((p + "mlp.%s.weight" % name, [rows, cols]))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [c["vocab_size"], h]))
    return sorted(out)


def encode(dtype, values):
    raw = struct.pack("<%df" % len(values), *values)
    if dtype == "F32":
        return raw
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))  # BF16: the upper half


def write_file(path, items):
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, dtype, shape, data in items:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write(d, config_text, seed, dtype, shards, drop, extra, reshape):
    c = json.loads(config_text)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config_text)
    rng = random.Random(seed)
    items = []
    for name, shape in tensors(c):
        if name == drop:
            continue
        if name == reshape:
            shape = [shape[0] + 1] + shape[1:]
        n = safetensors_ref.numel(shape)
        norm = name.endswith("norm.weight")
        values = [(1.0 + rng.gauss(0, 0.1)) if norm else rng.gauss(0, 0.02) for _ in range(n)]
        items.append((name, dtype, shape, encode(dtype, values)))
    if extra:
        items.append((extra, dtype, [4], encode(dtype, [0.0] * 4)))
    if shards <= 1:
        write_file(os.path.join(d, "model.safetensors"), items)
        return
    weight_map, total = {}, 0
    for s in range(shards):
        part = items[s::shards]
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write_file(os.path.join(d, file), part)
        for name, _, _, data in part:
            weight_map[name] = file
            total += len(data)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def values(d, name):
    info = safetensors_ref.read(d)[name]
    data = info["bytes"]
    if info["dtype"] == "F32":
        return [v for (v,) in struct.iter_unpack("<f", data)]
    if info["dtype"] == "BF16":
        return [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]
    if info["dtype"] == "F16":
        return [v for (v,) in struct.iter_unpack("<e", data)]
    raise SystemExit("%s: %s is %s" % (d, name, info["dtype"]))


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "write":
        opts = {"--seed": "0", "--dtype": "F32", "--shards": "1", "--drop": "", "--extra": "",
                "--reshape": ""}
        rest = args[3:]
        if len(rest) % 2 or any(k not in opts for k in rest[::2]):
            raise SystemExit(__doc__)
        opts.update(dict(zip(rest[::2], rest[1::2])))
        write(args[1], args[2], int(opts["--seed"]), opts["--dtype"], int(opts["--shards"]),
              opts["--drop"], opts["--extra"], opts["--reshape"])
    elif len(args) == 3 and args[0] == "values":
        for v in values(args[1], args[2]):
            print(repr(v))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
