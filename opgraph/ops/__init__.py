"""Op families, one module each. Importing this package registers every op kind and builder."""

from . import conv, custom, gather, layout, matmul, norm, pointwise, pooling, reduction  # noqa: F401
from .base import BUILDERS, OPS, Op, graph_method, register_op  # noqa: F401
