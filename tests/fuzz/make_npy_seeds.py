#!/usr/bin/env python3
"""Writes the seed corpus of npy_fuzz (corpus/npy/) without numpy: small .npy files in numpy's
own layout (magic, version, little-endian header length, the header dict padded with spaces to
a 64-byte boundary and ended by a newline, then the data), one per dtype and version that
client/npy.h reads, and one of each kind it refuses. Run from anywhere; rewrites the files."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "npy")


def npy(descr, shape, data, version=(1, 0), fortran=False, quote="'"):
    shape_text = "(" + "".join(f"{d}, " for d in shape).rstrip(" ")
    if len(shape) != 1:
        shape_text = shape_text.rstrip(",")
    shape_text += ")"
    q = quote
    header = (f"{{{q}descr{q}: {q}{descr}{q}, {q}fortran_order{q}: {fortran}, "
              f"{q}shape{q}: {shape_text}, }}")
    length_size = 2 if version[0] == 1 else 4
    prefix = 6 + 2 + length_size
    total = prefix + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    length = struct.pack("<H" if length_size == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header.encode("latin1") + data


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "f4-2x3.npy": npy("<f4", (2, 3), struct.pack("<6f", *range(6))),
        "f8-3.npy": npy("<f8", (3,), struct.pack("<3d", 0.5, -1.0, 2.0)),
        "i8-2x2.npy": npy("<i8", (2, 2), struct.pack("<4q", 1, -2, 3, 4)),
        "i4-scalar.npy": npy("<i4", (), struct.pack("<i", 7)),
        "f4-empty.npy": npy("<f4", (0, 4), b""),
        "f4-v2-dquote.npy": npy("<f4", (2,), struct.pack("<2f", 1, 2), version=(2, 0),
                                quote='"'),
        "f4-v3.npy": npy("<f4", (1,), struct.pack("<f", 3), version=(3, 0)),
        "f4-fortran-1d.npy": npy("<f4", (2,), struct.pack("<2f", 1, 2), fortran=True),
        "refused-big-endian.npy": npy(">f4", (1,), struct.pack(">f", 1)),
        "refused-short-data.npy": npy("<f8", (4,), struct.pack("<d", 1)),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
