"""The host fallback: an op without a torch mapping runs the reference implementation on the CPU.
Its inputs are copied to the host as float64 (a device synchronisation on CUDA), the reference
computes and rounds the outputs, and they are copied back to the device in their declared types.
Correct, and slow: configs with such an op carry BehaviorNote.HOST_EXECUTION.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.torch_interop import numpy_to_torch
from ..shared.evaluate import load_integers, run_node
from .common import Call, to_numpy_f64


def run_on_host(call: Call) -> list[Any]:
    """Run `call.node` with the reference engine; outputs as torch tensors on the call's device."""
    import torch

    def read(uid: int) -> np.ndarray:
        value = to_numpy_f64(call.values[uid])
        return value.reshape(call.tensors[uid].dim) if value.shape != call.tensors[uid].dim else value

    def read_integers(uid: int) -> np.ndarray:  # exact int64 (Op.integer_inputs: a Philox seed)
        value, desc = call.values[uid], call.tensors[uid]
        if not desc.data_type.is_integer:
            return read(uid)
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu", torch.int64).numpy()
        return load_integers(value, desc)

    results = run_node(call.node, call.tensors, read, read_integers)
    device = str(call.device)
    return [None if r is None else numpy_to_torch(np.ascontiguousarray(r), device) for r in results]
