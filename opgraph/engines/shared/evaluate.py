"""One node evaluated by its op's `reference` method (its definition) in float64, outputs rounded to their
declared types: the reference engine runs pieces so, and the torch engine runs so an op it has no
mapping of (on the host)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.errors import ExecutionError
from ...core.ir import Const, Node
from ...core.rounding import round_to, to_f64
from ...core.tensor import TensorDesc


def load(value: Any, desc: TensorDesc) -> np.ndarray:
    """A bound buffer (array or pass-by-value number) as float64 in logical dims."""
    if isinstance(value, np.ndarray):
        arr = to_f64(value)
        return arr.reshape(desc.dim) if arr.shape != desc.dim else arr
    return np.full(desc.dim, float(value), dtype=np.float64)


def load_integers(value: Any, desc: TensorDesc) -> np.ndarray:
    """An integer-typed bound buffer or pass-by-value number as int64 in logical dims, exact (a Philox
    seed above 2**53 does not survive float64); any other type as `load` reads it."""
    if not desc.data_type.is_integer:
        return load(value, desc)
    if isinstance(value, np.ndarray):
        arr = value.astype(np.int64)
        return arr.reshape(desc.dim) if arr.shape != desc.dim else arr
    return np.full(desc.dim, int(value), dtype=np.int64)


def memory_budget() -> int:
    """The most bytes one float64 tensor may take here: OPGRAPH_REFERENCE_MAX_GB, else this machine's
    physical memory."""
    text = os.environ.get("OPGRAPH_REFERENCE_MAX_GB", "").strip()
    try:
        if text:
            return int(float(text) * 2**30)
    except (ValueError, OverflowError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 64 * 2**30


def too_big(node: Node, tensors: Mapping[int, TensorDesc]) -> str | None:
    """Why `node` cannot be evaluated here, or None: it is computed on float64 arrays of every tensor's
    logical dims, so an input expanded by stride-0 axes is materialised whole."""
    budget = memory_budget()
    for uid in (*node.input_uids(), *node.output_uids()):
        desc = tensors[uid]
        size = math.prod(desc.dim) * 8
        if size > budget:
            return (
                f"{desc.label()} has {math.prod(desc.dim):,} logical elements ({list(desc.dim)}): the reference "
                f"engine computes on float64 arrays of logical dims, {size / 2**30:,.0f} GiB, more than the "
                f"{budget / 2**30:,.0f} GiB this machine allows it"
            )
    return None


def run_node(node: Node, tensors: Mapping[int, TensorDesc], read, read_integers=None) -> list[np.ndarray | None]:
    """Evaluate one node; `read(uid)` gives an input as float64, `read_integers(uid)` one the op reads
    as exact integers (`Op.integer_inputs`: int64 for an integer type; `read` where not given).
    Returns outputs rounded to type. A node whose tensors would not fit in memory as float64 arrays
    is refused before anything is allocated (ExecutionError, rule reference.memory)."""
    why = too_big(node, tensors)
    if why is not None:
        raise ExecutionError(
            why,
            op=node.label(),
            rule="reference.memory",
            hint="run it on another engine (a GPU's), or with smaller dims; OPGRAPH_REFERENCE_MAX_GB "
            "raises the limit where the machine has the memory",
        )
    exact = node.op.integer_inputs()
    ins: list[np.ndarray | None] = []
    for role, v in zip(node.op.input_roles(), node.inputs):
        if v is None:
            ins.append(None)
        elif isinstance(v, Const):
            whole = role in exact and isinstance(v.value, int)
            ins.append(
                np.asarray(int(v.value), dtype=np.int64) if whole else np.asarray(float(v.value), dtype=np.float64)
            )
        elif role in exact and read_integers is not None:
            ins.append(read_integers(v))
        else:
            ins.append(read(v))
    outs = [None if u is None else tensors[u] for u in node.outputs]
    results = node.op.reference(ins, outs)
    return [None if d is None or r is None else round_to(r, d.data_type) for d, r in zip(outs, results)]
