"""Op families, one module each. Importing this package registers every op kind and builder."""

from ..core.op import BUILDERS, OPS, Op, graph_method, register_op  # noqa: F401
from . import attention, conv, custom, gather, layout, matmul, norm, pointwise, pooling, reduction  # noqa: F401
