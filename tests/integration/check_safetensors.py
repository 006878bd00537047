#!/usr/bin/env python3
"""Independent safetensors reader: checks a file against the format and prints its tensors.

    python3 check_safetensors.py FILE [--expect name:dtype:shape ...]

Parses FILE as the format specifies (u64 little-endian header length N, N bytes of JSON, the
data buffer), validates what the reference reader validates (header length bound, JSON object,
known dtypes, offsets that tile the data buffer with byte counts matching the shapes, no
trailing bytes, no duplicate names) and prints one line per tensor: name, dtype, shape and the
sum of its values (as float64). Each --expect names a tensor that must exist with that dtype and
shape; the shape is written as comma- or x-separated dims, optionally in brackets, and empty for
a 0-dim tensor ("w:F32:[4,8]", "b:F32:4", "step:I64:"). Exit status 1 on any problem.

Written apart from k3rt's C reader on purpose (standard library + numpy only), so that the two
check each other.
"""
import json
import struct
import sys

import numpy as np

MAX_HEADER = 100_000_000

# Bits per element of every dtype of the format.
BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
    "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F8_E4M3": 8,
    "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6,
}

NUMPY = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8", "U64": "<u8",
}


class FormatError(Exception):
    pass


def fp8_e4m3_table():
    """float32 value of every F8_E4M3 (e4m3fn) byte: bias 7, no infinities, NaN at S.1111.111."""
    out = np.zeros(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            out[b] = np.nan
        elif exp == 0:
            out[b] = sign * man / 8.0 * 2.0 ** -6
        else:
            out[b] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return out


def values(dtype, raw):
    """The tensor's values as float64, or None for dtypes this checker does not decode."""
    if dtype in NUMPY:
        return np.frombuffer(raw, dtype=NUMPY[dtype]).astype(np.float64)
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if dtype == "F8_E4M3":
        return fp8_e4m3_table()[np.frombuffer(raw, dtype=np.uint8)]
    return None


def no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise FormatError(f"duplicate key '{key}' in the header")
        seen[key] = value
    return seen


def is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse(buf):
    """[(name, dtype, shape, bytes)] in data order, and the metadata dict (or None)."""
    if len(buf) < 8:
        raise FormatError(f"file is {len(buf)} bytes, too short for the header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER:
        raise FormatError(f"header length {n} exceeds {MAX_HEADER}")
    if n > len(buf) - 8:
        raise FormatError(f"header length {n} is larger than the {len(buf) - 8} bytes after it")
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and
                                 all(isinstance(v, str) for v in meta.values())):
        raise FormatError("__metadata__ must map strings to strings")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise FormatError(f"tensor '{name}': not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in BITS:
            raise FormatError(f"tensor '{name}': unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(is_count(d) for d in shape):
            raise FormatError(f"tensor '{name}': bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(is_count(o) for o in offsets) or offsets[0] > offsets[1]):
            raise FormatError(f"tensor '{name}': bad data_offsets {offsets!r}")
        entries.append((offsets[0], offsets[1], name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    data = buf[8 + n:]
    at, out = 0, []
    for begin, end, name, dtype, shape in entries:
        if begin != at:
            raise FormatError(f"tensor '{name}' starts at {begin}, expected {at} "
                              f"({'overlap' if begin < at else 'gap'})")
        bits = int(np.prod(shape, dtype=object)) * BITS[dtype]
        if bits % 8 or end - begin != bits // 8:
            raise FormatError(f"tensor '{name}': {end - begin} bytes for {dtype} {shape}")
        out.append((name, dtype, shape, data[begin:end]))
        at = end
    if len(data) != at:
        raise FormatError(f"data buffer is {len(data)} bytes, tensors cover {at}")
    return out, meta


def parse_expect(text):
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise ValueError(f"--expect {text!r}: want name:dtype:shape")
    name, dtype, shape = parts
    shape = shape.strip().strip("[]()").replace("x", ",")
    dims = [int(d) for d in shape.split(",") if d.strip()]
    return name, dtype, dims


def main(argv):
    args = argv[1:]
    if not args or args[0].startswith("-"):
        print("usage: check_safetensors.py FILE [--expect name:dtype:shape ...]",
              file=sys.stderr)
        return 1
    path, expects = args[0], []
    rest = args[1:]
    while rest:
        if rest[0] != "--expect" or len(rest) < 2:
            print(f"unknown argument {rest[0]!r}", file=sys.stderr)
            return 1
        try:
            expects.append(parse_expect(rest[1]))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 1
        rest = rest[2:]
    try:
        with open(path, "rb") as f:
            buf = f.read()
        tensors, meta = parse(buf)
    except (OSError, FormatError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    ok = True
    for name, dtype, shape, raw in tensors:
        v = values(dtype, raw)
        total = "n/a" if v is None else repr(float(v.sum()))
        print(f"{name}\t{dtype}\t{list(shape)}\tsum={total}")
    if meta:
        for key in sorted(meta):
            print(f"__metadata__\t{key}={meta[key]}")
    found = {name: (dtype, list(shape)) for name, dtype, shape, _ in tensors}
    for name, dtype, dims in expects:
        if name not in found:
            print(f"{path}: expected tensor '{name}' is missing", file=sys.stderr)
            ok = False
        elif found[name] != (dtype, dims):
            print(f"{path}: tensor '{name}' is {found[name][0]} {found[name][1]}, "
                  f"expected {dtype} {dims}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
