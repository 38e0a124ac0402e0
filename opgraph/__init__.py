"""opgraph: an open, debuggable operation-graph library for deep-learning primitives.

Declare tensors and ops on a `Graph`, `build()` an `ExecutionPlan`, `execute()` it on a variant
pack of buffers. Every graph also runs on the CPU through the reference engine.

The public names below are explicit re-exports; the layers they come from (core <- ops, memory <-
graph <- engines <- build <- runtime <- autodiff, frontends, training <- tools) are described in
docs/architecture.md.
"""

from typing import TYPE_CHECKING, Any

from .build.heuristics import PieceConfigs
from .build.options import BuildOptions
from .core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote
from .core.device import Device
from .core.dtypes import DataType
from .core.errors import (
    AttributeValueError,
    BuildOptionError,
    DataflowError,
    DataTypeError,
    DistributedError,
    DuplicateUIDError,
    ExecutionError,
    GraphError,
    RegistrationError,
    SerializationError,
    ShapeError,
    StateDictError,
    UnsupportedGraphError,
    VariantPackError,
)
from .core.ir import Const, FinalGraph, Node
from .core.log import configure_from_env as _configure_logging
from .core.symbolic import Dim
from .core.tensor import Tensor, TensorDesc
from .core.version import __version__
from .graph.builder import Graph
from .ops.attention import DiagonalAlignment
from .ops.conv import ConvolutionMode
from .ops.custom import register_custom_op
from .ops.norm_common import NormForwardPhase
from .ops.pointwise import PointwiseMode
from .ops.pooling import ResampleMode
from .ops.reduction import ReductionMode
from .runtime.plan import ExecutionPlan, StepTime, load_plan

# Loaded on first use: gradients, the PyTorch importer, training graphs and test helpers are not
# needed to build and run a graph, and importing them costs most of `import opgraph`.
_LAZY = {
    "grad": ".autodiff",
    "GradGraph": ".autodiff",
    "from_torch": ".frontends",
    "testing": ".testing",
    "training": ".training",
    "torch_backend": ".frontends.dynamo_backend",
    "compile": ".frontends.autograd_module",
}

if TYPE_CHECKING:
    from . import testing, training
    from .autodiff.grad import GradGraph, grad
    from .frontends import from_torch
    from .frontends.autograd_module import compile
    from .frontends.dynamo_backend import torch_backend


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __name__)
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opgraph' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_configure_logging()

__all__ = [
    "AttributeValueError",
    "BehaviorNote",
    "BuildOptionError",
    "BuildOptions",
    "Const",
    "ConvolutionMode",
    "DataType",
    "DataTypeError",
    "DataflowError",
    "Device",
    "DiagonalAlignment",
    "Dim",
    "DistributedError",
    "DuplicateUIDError",
    "EngineConfig",
    "ExecutionError",
    "ExecutionPlan",
    "FinalGraph",
    "GradGraph",
    "Graph",
    "GraphError",
    "HeurMode",
    "Node",
    "NormForwardPhase",
    "NumericalNote",
    "PieceConfigs",
    "PointwiseMode",
    "ReductionMode",
    "RegistrationError",
    "ResampleMode",
    "SerializationError",
    "ShapeError",
    "StateDictError",
    "StepTime",
    "Tensor",
    "TensorDesc",
    "UnsupportedGraphError",
    "VariantPackError",
    "__version__",
    "compile",
    "from_torch",
    "grad",
    "load_plan",
    "register_custom_op",
    "testing",
    "torch_backend",
    "training",
]
