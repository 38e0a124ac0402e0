"""A corpus of hostile and broken graph and plan files (issue 38): truncated, wrong types, huge strings,
lone surrogates, bad indexes, malformed plan documents under a valid checksum, huge logical sizes."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import opgraph as og

D = og.DataType
MAGIC = b"OPGRAPH-PLAN 2 "


def graph_doc() -> dict[str, Any]:
    g = og.Graph("hostile", io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 4], name="x")
    b = g.tensor(dim=[1, 4], name="b")
    g.relu(g.add(x, b)).set_output(True).set_name("y")
    return json.loads(g.to_json())


def attention_doc() -> dict[str, Any]:
    g = og.Graph("att", io_data_type=D.HALF)
    q, k, v = (g.tensor(dim=[1, 1, 4, 8], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, score_mod=lambda s, x: s.tanh(x), attn_scale=0.25, generate_stats=False)
    o.set_output(True)
    return json.loads(g.to_json())


def plan_bytes() -> bytes:
    g = og.Graph.from_json(json.dumps(graph_doc()))
    return g.build(device="cpu", engines=["reference"]).to_bytes()


def plan_doc(data: bytes) -> dict[str, Any]:
    return json.loads(data.partition(b"\n")[2])


def seal(doc: Any) -> bytes:
    """A plan file of `doc` with a valid checksum (however malformed the document)."""
    body = json.dumps(doc).encode()
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _edit(doc: dict, fn: Callable[[dict], Any]) -> dict:
    d = copy.deepcopy(doc)
    fn(d)
    return d


def corpus(folder: Path) -> dict[str, Path]:
    """Write every hostile file into `folder`: {case name: path}."""
    g = graph_doc()
    p = plan_bytes()
    pd = plan_doc(p)
    files: dict[str, bytes] = {
        "empty": b"",
        "binary": bytes(range(256)) * 4,
        "not-utf8": b'{"format": "opgraph.graph", "name": "\xff\xfe"}',
        "truncated-graph": json.dumps(g).encode()[: len(json.dumps(g)) // 2],
        "truncated-plan": p[: len(p) // 2],
        "plan-header-only": MAGIC + b"0" * 64 + b"\n",
        "a-list": b"[1, 2, 3]",
        "a-number": b"1e999",
        "deep": b"[" * 100000 + b"]" * 100000,
        "huge-number": json.dumps(_edit(g, lambda d: d["tensors"][0].update(dim=[10**400, 4]))).encode(),
    }
    graphs: dict[str, dict] = {
        "tensors-an-object": _edit(g, lambda d: d.update(tensors={"a": 1})),
        "tensor-a-string": _edit(g, lambda d: d["tensors"].__setitem__(0, "x")),
        "dim-a-string": _edit(g, lambda d: d["tensors"][0].update(dim="2,4")),
        "dim-of-strings": _edit(g, lambda d: d["tensors"][0].update(dim=["2", "4"])),
        "dim-negative": _edit(g, lambda d: d["tensors"][0].update(dim=[-2, 4])),
        "uid-a-string": _edit(g, lambda d: d["tensors"][0].update(uid="1")),
        "uid-huge": _edit(g, lambda d: d["tensors"][0].update(uid=2**200)),
        "ops-null": _edit(g, lambda d: d.update(ops=None)),
        "op-kind-a-number": _edit(g, lambda d: d["ops"][0].update(op=5)),
        "attrs-a-list": _edit(g, lambda d: d["ops"][0].update(attrs=[1])),
        "mode-unknown": _edit(g, lambda d: d["ops"][0]["attrs"].update(mode="NOPE")),
        "inputs-a-list": _edit(g, lambda d: d["ops"][0].update(inputs=[1])),
        "input-const-a-string": _edit(g, lambda d: d["ops"][0]["inputs"].update(input1={"const": "x"})),
        "huge-unknown-key": _edit(g, lambda d: d.update({"k" * 200_000: 1})),
        "long-unknown-key-under-the-limit": _edit(g, lambda d: d.update({"k" * 60_000: 1})),
        "huge-name": _edit(g, lambda d: d["tensors"][0].update(name="n" * 200_000)),
        "huge-mode": _edit(g, lambda d: d["ops"][0]["attrs"].update(mode="M" * 60_000)),
        "lone-surrogate-name": _edit(g, lambda d: d["tensors"][0].update(name="\ud800")),
        "control-chars-name": _edit(g, lambda d: d.update(name="a\x1b[31mred\x07\n")),
        "surrogate-graph-name": _edit(g, lambda d: d.update(name="\udfff\ud800")),
        "surrogate-unknown-key": _edit(g, lambda d: d.update({"\ud800": 1})),
        "huge-dims": _edit(
            g,
            lambda d: [
                t.update(dim=[2**20, 2**20], stride=[2**20, 1])
                if t["name"] != "b"
                else t.update(dim=[1, 2**20], stride=[2**20, 1])
                for t in d["tensors"]
            ],
        ),
        "score-mod-negative-index": _edit(
            attention_doc(), lambda d: d["ops"][0]["attrs"]["score_mod"]["result"].update(index=-1)
        ),
        "score-mod-index-past-the-end": _edit(
            attention_doc(), lambda d: d["ops"][0]["attrs"]["score_mod"]["result"].update(index=3)
        ),
    }
    plans: dict[str, dict | Any] = {
        "plan-a-list": [1, 2],
        "plan-steps-an-object": _edit(pd, lambda d: d.update(steps={"a": 1})),
        "plan-steps-of-numbers": _edit(pd, lambda d: d.update(steps=[1, 2])),
        "plan-step-nodes-strings": _edit(pd, lambda d: d["steps"][0].update(nodes=["a"])),
        "plan-step-config-a-list": _edit(pd, lambda d: d["steps"][0].update(config=[1])),
        "plan-knobs-an-object": _edit(pd, lambda d: d["steps"][0]["config"].update(knobs={"a": 1})),
        "plan-knobs-of-numbers": _edit(pd, lambda d: d["steps"][0]["config"].update(knobs=[1, 2])),
        "plan-graph-missing": _edit(pd, lambda d: d.pop("graph")),
        "plan-graph-a-list": _edit(pd, lambda d: d.update(graph=[1])),
        "plan-graph-ops-a-string": _edit(pd, lambda d: d["graph"].update(ops="x")),
        "plan-graph-op-entries-numbers": _edit(pd, lambda d: d["graph"].update(ops=[1])),
        "plan-device-a-string": _edit(pd, lambda d: d.update(device="cpu")),
        "plan-environment-a-list": _edit(pd, lambda d: d.update(environment=[1])),
        "plan-artifacts-an-object": _edit(pd, lambda d: d.update(artifacts={"a": 1})),
        "plan-surrogate-names": _edit(pd, lambda d: d["graph"]["tensors"][0].update(name="\ud800")),
        "plan-huge-string": _edit(pd, lambda d: d["environment"].update(opgraph="v" * 200_000)),
        "plan-version-a-string": _edit(pd, lambda d: d.update(version="2")),
    }
    for name, doc in graphs.items():
        files[name] = json.dumps(doc).encode()
    for name, doc in plans.items():
        files[name] = seal(doc)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in files.items():
        path = folder / f"{name}.json"
        path.write_bytes(data)
        paths[name] = path
    return paths
