"""Op families, one module each. Importing this package registers every op kind and builder."""

from ..core.op import BUILDERS, OPS, Op, graph_method, register_op  # noqa: F401
from . import (  # noqa: F401
    adalayernorm,
    attention,
    attention_builders,
    attention_fp8,
    causal_conv1d,
    collective,
    conv,
    custom,
    gather,
    layernorm,
    layout,
    matmul,
    norm,
    pointwise,
    pointwise_builders,
    pooling,
    pooling_backward,
    reduction,
    scan,
)
