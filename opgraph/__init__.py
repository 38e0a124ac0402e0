"""opgraph: an open, debuggable operation-graph library for deep-learning primitives.

Declare tensors and ops on a `Graph`, `build()` an `ExecutionPlan`, `execute()` it on a variant
pack of buffers. Every graph also runs on the CPU through the reference engine.
"""

from . import testing, training
from .core.dtypes import DataType
from .core.device import Device
from .core.config import BehaviorNote, EngineConfig, NumericalNote
from .core.errors import (
    AttributeValueError,
    DataflowError,
    DataTypeError,
    DuplicateUIDError,
    ExecutionError,
    GraphError,
    SerializationError,
    ShapeError,
    UnsupportedGraphError,
    VariantPackError,
)
from .graph.builder import Graph
from .autodiff import GradGraph, grad
from .frontends import from_torch
from .core.config import HeurMode
from .build.heuristics import PieceConfigs
from .core.ir import Const, FinalGraph, Node
from .ops.conv import ConvolutionMode
from .ops.custom import register_custom_op
from .ops.norm import NormForwardPhase
from .ops.pointwise import PointwiseMode
from .ops.pooling import ResampleMode
from .ops.reduction import ReductionMode
from .runtime.plan import ExecutionPlan, StepTime, load_plan
from .core.tensor import Tensor, TensorDesc

__version__ = "0.1.0"

from .core.log import configure_from_env as _configure_logging  # noqa: E402

_configure_logging()

__all__ = [
    "AttributeValueError", "BehaviorNote", "Const", "ConvolutionMode", "DataType", "DataTypeError",
    "DataflowError", "Device", "DuplicateUIDError", "EngineConfig", "ExecutionError", "ExecutionPlan",
    "FinalGraph", "GradGraph", "Graph", "GraphError", "HeurMode", "Node", "NormForwardPhase", "NumericalNote",
    "PieceConfigs", "PointwiseMode", "ReductionMode", "ResampleMode", "SerializationError", "ShapeError", "StepTime",
    "Tensor", "TensorDesc", "UnsupportedGraphError", "VariantPackError", "load_plan", "register_custom_op", "grad", "from_torch",
]
