"""A Hugging Face folder that `k3rt export` wrote, read back as k3rt's model for the PyTorch
peers (torch_common.py --hf DIR): config.json's `k3rt.model` is the model document, and every
Hub tensor goes back to its k3rt name and layout by the rules of plugins/hf_names.json, the
table k3rt export and import read (docs/interop.md), so no mapping is repeated here.

A routed FFN's balancer bias comes back from the Hub router's e_score_correction_bias (the
table's "balancer_state"), so the folder routes as k3rt's checkpoint does.
"""
import json
import os
import sys

import torch

DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins",
                             "hf_names.json")


def _fail(msg):
    sys.exit(msg)


def read_hub_tensors(folder, read_safetensors):
    """{hub name: tensor} of model.safetensors, or of every shard the index lists."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
        _fail(f"{index}: no \"weight_map\" object")
    out = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(folder, shard)).items():
            if weight_map.get(name) != shard:
                _fail(f"{index}: tensor {name} is in {shard}, the index says "
                      f"{weight_map.get(name)}")
            out[name] = t
    missing = set(weight_map) - set(out)
    if missing:
        _fail(f"{index}: lists {sorted(missing)[:3]}, which no shard holds")
    return out


class _Mapper:
    """Hub tensors -> k3rt parameters, consuming each Hub tensor once."""

    def __init__(self, hub, table_path, d_model):
        self.hub, self.used, self.w, self.table_path = hub, set(), {}, table_path
        self.state, self.d_model = {}, d_model

    def take(self, name):
        self.used.add(name)
        return self.hub[name]

    def put(self, name, t):
        self.w[name] = t.contiguous()

    def module(self, ent, spec, i, slot):
        """One mixer or FFN instance's parameters by the table's rules for its plugin."""
        prefix = ent["prefix"].replace("{i}", str(i))
        own = f"layers.{i}.{slot}."
        rules = {p: ({"name": r} if isinstance(r, str) else r) for p, r in ent["params"].items()}
        for key, rule in ent.get("balancer_state", {}).items():
            if prefix + rule["name"] in self.hub:
                self.state[f"layers.{i}.balancer.{key}"] = self.take(prefix + rule["name"])
        for p, rule in rules.items():
            if "fused_into" in rule:
                continue
            name = rule["name"]
            for other, alt in rule.get("name_if_present", {}).items():
                if prefix + rules[other]["name"] in self.hub:
                    name = alt
            hub_name = prefix + name
            if rule.get("split_experts"):
                parts = []
                while prefix + name.replace("{j}", str(len(parts))) in self.hub:
                    parts.append(self.take(prefix + name.replace("{j}", str(len(parts)))))
                if parts:
                    self.put(own + p, torch.stack(parts))
                continue
            if hub_name not in self.hub:  # a parameter this instance's options leave out
                if rule.get("identity_if_absent") and spec["config"].get("latent") == self.d_model:
                    self.put(own + p, torch.eye(self.d_model))  # Kimi-Linear: no latent
                continue
            t = self.take(hub_name)
            if "view" in rule:
                self.put(own + p, t.reshape(-1))
            elif rule.get("conv1d"):
                self.put(own + p, t.reshape(t.shape[0], t.shape[-1]))
            elif "fuse_heads" in rule:
                H = spec["config"]["heads"]
                widths = [spec["config"][w] or 0 for w in rule["widths"]]
                v = t.reshape(H, sum(widths), t.shape[-1])
                at = 0
                for part, wd in zip(rule["fuse_heads"], widths):
                    if wd:
                        self.put(own + part, v[:, at:at + wd].reshape(H * wd, t.shape[-1]))
                    at += wd
            else:
                self.put(own + p, t)


class HubFolder:
    """What torch_common.Checkpoint offers (dir, doc, model, weights, state), from DIR."""

    def __init__(self, folder, read_safetensors, table_path=None):
        self.dir = folder
        cpath = os.path.join(folder, "config.json")
        with open(cpath) as f:
            cfg = json.load(f)
        k3 = cfg.get("k3rt")
        if not isinstance(k3, dict) or not isinstance(k3.get("model"), dict):
            _fail(f"{cpath}: no \"k3rt\".\"model\" block (a folder `k3rt export` wrote); for "
                  "a Hub model without it, `k3rt import` it first")
        self.model = k3["model"]
        self.doc = {"model": self.model, "plan": k3.get("plan", {}),
                    "optimizer": {"plugin": "adamw", "config": {}}}
        table_path = table_path or DEFAULT_TABLE
        with open(table_path) as f:
            table = json.load(f)
        self.weights, self.state = self._map(read_hub_tensors(folder, read_safetensors), table,
                                             table_path)

    def _map(self, hub, table, table_path):
        m, L = self.model, self.model["layers"]
        mp = _Mapper(hub, table_path, m["d_model"])
        for k, h in table["model"]["params"].items():
            for i in (range(L) if "{i}" in k else [0]):
                hn = h.replace("{i}", str(i))
                if hn not in hub:
                    _fail(f"{self.dir}: no tensor {hn} (k3rt's {k.replace('{i}', str(i))})")
                mp.put(k.replace("{i}", str(i)), mp.take(hn))
        plugins = table["plugins"]
        if m["residual"]["plugin"] not in plugins:
            _fail(f"{table_path}: residual plugin {m['residual']['plugin']} is not in the table")
        for i in range(L):
            ffn = m["dense_ffn"] if i < m.get("dense_layers", 0) else m["ffn"]
            for slot, spec in (("mixer", m["mixers"][m["pattern"][i]]), ("ffn", ffn)):
                ent = plugins.get(spec["plugin"])
                if ent is None:
                    _fail(f"{table_path}: plugin {spec['plugin']} (layers.{i}.{slot}) is not "
                          "in the table")
                mp.module(ent, spec, i, slot)
        left = sorted(set(hub) - mp.used)
        if left:
            _fail(f"{self.dir}: {len(left)} tensors map to no k3rt parameter by {table_path}, "
                  f"e.g. {left[:3]}")
        return mp.w, mp.state
