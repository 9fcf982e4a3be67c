#!/usr/bin/python3
"""An independent safetensors writer and reader for the tests, written from the published format
(https://huggingface.co/docs/safetensors: an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}} plus an optional "__metadata__", then the data), with only
the standard library: struct, json, hashlib. It shares nothing with common/safetensors.

  safetensors_ref.py write FILE [--shards N]   writes the fixture tensors (below) to FILE, or as
                                               N shards plus model.safetensors.index.json into
                                               the directory FILE
  safetensors_ref.py read PATH                 prints {name: {dtype, shape, sha256}} as JSON for
                                               a file, or for a directory (single file or index)
  safetensors_ref.py f32 PATH NAME             prints a F32 tensor's values, one per line

The fixture: every tensor's element i is (i * 37 % 101) - 50 as its dtype holds it (F32, F64,
I64, I32, U8 exactly; F16 and BF16 of the same small integers, exact in both; BOOL i % 3 == 0).
"""
import hashlib
import json
import os
import struct
import sys

FIXTURE = [
    ("model.embed_tokens.weight", "F32", [5, 4]),
    ("model.layers.0.self_attn.q_proj.weight", "BF16", [4, 4]),
    ("model.layers.0.mlp.down_proj.weight", "F16", [3, 4]),
    ("model.norm.weight", "F64", [4]),
    ("position_ids", "I64", [2, 3]),
    ("counts", "I32", [7]),
    ("bytes", "U8", [9]),
    ("mask", "BOOL", [5]),
    ("empty", "F32", [0, 3]),
    ("scalar", "F32", []),
]


def value(i):
    return (i * 37 % 101) - 50


def encode(dtype, n):
    vals = [value(i) for i in range(n)]
    if dtype == "F32":
        return struct.pack("<%df" % n, *vals)
    if dtype == "F64":
        return struct.pack("<%dd" % n, *vals)
    if dtype == "F16":
        return struct.pack("<%de" % n, *vals)
    if dtype == "BF16":  # the upper half of the float32: exact for these small integers
        return b"".join(struct.pack("<f", v)[2:] for v in vals)
    if dtype == "I64":
        return struct.pack("<%dq" % n, *vals)
    if dtype == "I32":
        return struct.pack("<%di" % n, *vals)
    if dtype == "U8":
        return bytes(v % 256 for v in vals)
    if dtype == "BOOL":
        return bytes(1 if i % 3 == 0 else 0 for i in range(n))
    raise ValueError(dtype)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_file(path, tensors):
    # Data in reverse name order, so that the header's key order is not the data's.
    header = {"__metadata__": {"format": "pt", "writer": "safetensors_ref.py"}}
    blobs = []
    offset = 0
    for name, dtype, shape in sorted(tensors, key=lambda t: t[0], reverse=True):
        data = encode(dtype, numel(shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write(path, shards):
    if shards <= 1:
        write_file(path, FIXTURE)
        return
    os.makedirs(path, exist_ok=True)
    weight_map = {}
    total = 0
    for s in range(shards):
        part = FIXTURE[s::shards]
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write_file(os.path.join(path, name), part)
        for t in part:
            weight_map[t[0]] = name
            total += len(encode(t[1], numel(t[2])))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def read_file(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = {"dtype": info["dtype"], "shape": info["shape"],
                     "sha256": hashlib.sha256(data[begin:end]).hexdigest(),
                     "bytes": data[begin:end]}
    return out


def read(path):
    if not os.path.isdir(path):
        return read_file(path)
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(path, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        for name, info in read_file(os.path.join(path, shard)).items():
            if weight_map.get(name) != shard:
                raise SystemExit("%s: %s is not listed for %s" % (path, name, shard))
            out[name] = info
    return out


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        shards = int(sys.argv[4]) if len(sys.argv) == 5 and sys.argv[3] == "--shards" else 1
        write(sys.argv[2], shards)
    elif len(sys.argv) == 3 and sys.argv[1] == "read":
        tensors = read(sys.argv[2])
        for info in tensors.values():
            del info["bytes"]
        print(json.dumps(tensors, sort_keys=True))
    elif len(sys.argv) == 4 and sys.argv[1] == "f32":
        data = read(sys.argv[2])[sys.argv[3]]["bytes"]
        for (v,) in struct.iter_unpack("<f", data):
            print(repr(v))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
