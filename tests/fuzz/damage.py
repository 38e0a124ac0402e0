"""Damaged plan files: a saved plan with one thing changed (a knob set to 0, -1, None or a string, a
template name flipped, a field of the wrong type, an index out of range, bytes cut off or flipped).
Loading one must raise SerializationError, or give a plan that runs correctly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

# damaged files are written with the version-1 header (no checksum), so that the damage reaches the
# parser's checks; a version-2 file's checksum would refuse them all up front
from opgraph.runtime.plan_io import MAGIC_1 as MAGIC
from opgraph.runtime.plan_io import plan_body

ODD_VALUES: tuple[Any, ...] = (0, -1, None, 1.5, "x", True, [], {}, 2**40, -(2**63), "", [1, 2], 1e308, "tl.float32")


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _set(doc: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def damaged_plans(data: bytes, rng: np.random.Generator, count: int = 3) -> Iterator[tuple[str, bytes]]:
    """`count` damaged copies of plan file `data`, each with what was done to it."""
    doc = json.loads(plan_body(data))
    knob_paths = [
        p
        for p in _paths(doc)
        if len(p) >= 5 and p[0] == "steps" and p[2] == "config" and p[3] == "knobs" and len(p) == 6 and p[5] == 1
    ]
    paths = [p for p in _paths(doc) if p]
    for _ in range(count):
        d = json.loads(json.dumps(doc))
        r = rng.random()
        if r < 0.35 and knob_paths:
            path = _pick(rng, knob_paths)
            knob = d["steps"][path[1]]["config"]["knobs"][path[4]][0]
            if knob == "template":
                value = _pick(
                    rng, ("pointwise", "reduction", "matmul", "conv_fprop", "rownorm", "pooling", "nope", "gemm", 3)
                )
            else:
                value = _pick(rng, ODD_VALUES)
            _set(d, path, value)
            what = f"knob {knob} = {value!r}"
        elif r < 0.45 and knob_paths:
            path = _pick(rng, knob_paths)
            step = d["steps"][path[1]]["config"]
            what = f"knob {step['knobs'][path[4]][0]} removed"
            del step["knobs"][path[4]]
        elif r < 0.55:
            i = int(rng.integers(len(d["steps"])))
            value = _pick(rng, ("torch", "triton", "reference", "library", "cudnn", "nope", 7))
            d["steps"][i]["config"]["engine"] = value
            what = f"step {i} engine = {value!r}"
        elif r < 0.85:
            path = _pick(rng, paths)
            value = _pick(rng, ODD_VALUES)
            _set(d, path, value)
            what = f"{'.'.join(map(str, path))} = {value!r}"
        else:
            raw = bytearray(MAGIC + json.dumps(d).encode())
            if rng.random() < 0.5:
                cut = int(rng.integers(len(MAGIC), len(raw)))
                yield f"cut at byte {cut}", bytes(raw[:cut])
            else:
                at = int(rng.integers(len(raw)))
                raw[at] ^= 1 << int(rng.integers(8))
                yield f"bit flipped at byte {at}", bytes(raw)
            continue
        yield what, MAGIC + json.dumps(d).encode()
