#!/usr/bin/env python3
"""Checks a Hugging Face model folder as a Hub loader reads it, apart from k3rt's C code:

    python3 check_hf_folder.py DIR

config.json must be a JSON object with the KimiLinearConfig fields k3rt writes; the weights are
model.safetensors, or the shards model.safetensors.index.json lists, each valid by
check_safetensors.parse; the index must name every tensor of every shard exactly once with the
right file, and its total_size must be the bytes of all tensors. Prints
"tensors N bytes B shards S model_type T" and exits 1 on any problem.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_safetensors import FormatError, parse  # noqa: E402

FIELDS = ("hidden_size", "vocab_size", "num_hidden_layers", "rms_norm_eps", "model_type",
          "architectures")


def main(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    missing = [k for k in FIELDS if k not in cfg]
    if not isinstance(cfg, dict) or missing:
        raise FormatError(f"config.json lacks {missing}")
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        index, weight_map, files = None, None, ["model.safetensors"]
    names, total = {}, 0
    for file in files:
        with open(os.path.join(folder, file), "rb") as f:
            entries, _ = parse(f.read())
        for name, _, _, raw in entries:
            if name in names:
                raise FormatError(f"{name} in {names[name]} and {file}")
            names[name] = file
            total += len(raw)
    if index is not None:
        if weight_map != names:
            raise FormatError("the index's weight_map differs from the shards' tensors")
        if index["metadata"]["total_size"] != total:
            raise FormatError(f"total_size {index['metadata']['total_size']}, tensors {total}")
    print(f"tensors {len(names)} bytes {total} shards {len(files)} model_type "
          f"{cfg['model_type']}")


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except (OSError, KeyError, ValueError, FormatError) as e:
        print(f"check_hf_folder: {e}", file=sys.stderr)
        sys.exit(1)
