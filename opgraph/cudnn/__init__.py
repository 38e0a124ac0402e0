"""`opgraph.cudnn`: cuDNN frontend's Python API over opgraph, so that a cuDNN program runs by changing
its import (`import opgraph.cudnn as cudnn`).

    graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT,
                          handle=handle)
    X = graph.tensor(name="X", dim=[4, 16, 56, 56], stride=[50176, 1, 896, 16], data_type=torch.float16)
    ...
    graph.validate(); graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support(); graph.build_plans()
    graph.execute({X: x, W: w, Y: y}, workspace, handle=handle)

Plans run on the handle's device: a CUDA GPU (generated kernels, PyTorch, cuDNN where installed) or the
CPU (the reference engine, on CPU PyTorch tensors and NumPy arrays). Errors are cuDNN's types
(`cudnnGraphNotSupportedError`, RuntimeError) with opgraph's messages: op, tensor UID, rule, fix.
What differs from cuDNN: opgraph partitions a graph no single kernel runs instead of refusing it;
knobs are KERNEL_CFG only (an engine's ranked configs); serialize() returns opgraph's plan file;
populate_cuda_graph returns a torch.cuda.CUDAGraph; attention (sdpa, sdpa_backward, ragged tensors,
paged caches) as in cudnn/attention.py, FP8 attention refused; execute-time shape overrides only where
they restate the built shapes; create_kernel_cache returns a cache that holds nothing (kernel_cache.py).
This module imports opgraph's graph and runtime; nothing in them imports it.
"""

from __future__ import annotations

from ..core.tensor import Tensor as tensor
from .attention import attention_implementation
from .enums import (
    behavior_note,
    build_plan_policy,
    convolution_mode,
    data_type,
    diagonal_alignment,
    heur_mode,
    knob,
    knob_type,
    norm_forward_phase,
    numerical_note,
    pointwise_mode,
    reduction_mode,
    resample_mode,
    reshape_mode,
    scalar_type,
    tensor_reordering,
)
from .errors import cudnnGraphNotSupportedError
from .handles import Handle, create_handle, destroy_handle, get_stream, set_stream
from .kernel_cache import KernelCache, create_kernel_cache
from .pygraph import CHECK_STRIDES, pygraph, tensor_attributes
from .wrapper import Graph, graph, graph_cache, jit

__version__ = "1.23.0"  # the cuDNN frontend Python API this module mirrors (its attention signatures)
# The cuDNN API level the shim answers for (programs gate features on it; no cuDNN library is loaded):
# 9.20's attention (ragged, paged, band masks, sinks, score_max / score_sum_exp, -inf Stats of empty
# rows) and the 9.14 layernorm fusions. FP8 attention, block-scale quantization and MoE matmuls, which
# that level also has, are refused with cudnnGraphNotSupportedError or missing.
BACKEND_VERSION = 92000
_last_error = ""


def backend_version() -> int:
    return BACKEND_VERSION


def backend_version_string() -> str:
    major, rest = divmod(BACKEND_VERSION, 10000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def get_last_error_string() -> str:
    return _last_error


def __getattr__(name: str) -> object:
    if name == "ops":  # cudnn.ops (causal_conv1d), loaded on first use as cuDNN's is
        import importlib

        module = importlib.import_module(".ops", __name__)
        globals()["ops"] = module
        return module
    raise AttributeError(f"module 'opgraph.cudnn' has no attribute {name!r}")


__all__ = [
    "BACKEND_VERSION",
    "CHECK_STRIDES",
    "Graph",
    "Handle",
    "KernelCache",
    "attention_implementation",
    "create_kernel_cache",
    "backend_version",
    "backend_version_string",
    "behavior_note",
    "build_plan_policy",
    "convolution_mode",
    "create_handle",
    "cudnnGraphNotSupportedError",
    "data_type",
    "destroy_handle",
    "diagonal_alignment",
    "get_last_error_string",
    "get_stream",
    "graph",
    "graph_cache",
    "heur_mode",
    "jit",
    "knob",
    "knob_type",
    "norm_forward_phase",
    "numerical_note",
    "pointwise_mode",
    "pygraph",
    "reduction_mode",
    "resample_mode",
    "reshape_mode",
    "scalar_type",
    "set_stream",
    "tensor",
    "tensor_attributes",
    "tensor_reordering",
]
