"""One node evaluated by its op's `reference` method (its definition) in float64, outputs rounded to their
declared types: the reference engine runs pieces so, and the torch engine runs so an op it has no
mapping of (on the host)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.ir import Const, Node
from ...core.rounding import round_to, to_f64
from ...core.tensor import TensorDesc


def load(value: Any, desc: TensorDesc) -> np.ndarray:
    """A bound buffer (array or pass-by-value number) as float64 in logical dims."""
    if isinstance(value, np.ndarray):
        arr = to_f64(value)
        return arr.reshape(desc.dim) if arr.shape != desc.dim else arr
    return np.full(desc.dim, float(value), dtype=np.float64)


def run_node(node: Node, tensors: Mapping[int, TensorDesc], read) -> list[np.ndarray | None]:
    """Evaluate one node; `read(uid)` gives an input as float64. Returns outputs rounded to type."""
    ins: list[np.ndarray | None] = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
        elif isinstance(v, Const):
            ins.append(np.asarray(float(v.value), dtype=np.float64))
        else:
            ins.append(read(v))
    outs = [None if u is None else tensors[u] for u in node.outputs]
    results = node.op.reference(ins, outs)
    return [None if d is None or r is None else round_to(r, d.data_type) for d, r in zip(outs, results)]
