"""Sample graphs used by the demo, the examples, the tests and the benchmarks."""

from __future__ import annotations

from typing import Any

from ..core.dtypes import DataType
from ..core.tensor import channels_last_order, packed_strides
from ..graph.builder import Graph


def nhwc(dim: list[int]) -> list[int]:
    """Channels-last strides for logical dims [N, C, spatial...]."""
    return list(packed_strides(dim, channels_last_order(len(dim))))


def conv_bias_relu(
    n: int = 4,
    c: int = 16,
    k: int = 16,
    hw: int = 16,
    r: int = 3,
    *,
    padding: int = 1,
    data_type: Any = DataType.HALF,
    name: str = "conv_bias_relu",
) -> Graph:
    """y = relu(conv(x, w) + b), NHWC, the conv output and the sum virtual."""
    g = Graph(
        name=name, io_data_type=data_type, intermediate_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT
    )
    x = g.tensor(dim=[n, c, hw, hw], stride=nhwc([n, c, hw, hw]), name="X")
    w = g.tensor(dim=[k, c, r, r], stride=nhwc([k, c, r, r]), name="W")
    b = g.tensor(dim=[1, k, 1, 1], stride=nhwc([1, k, 1, 1]), name="B")
    conv = g.conv_fprop(x, w, padding=[padding, padding], stride=[1, 1], dilation=[1, 1], name="conv")
    biased = g.bias(conv, b, name="bias")
    g.relu(biased, name="relu").set_output(True).set_name("Y")
    return g


def batchnorm_relu(
    n: int = 4,
    c: int = 16,
    hw: int = 16,
    *,
    data_type: Any = DataType.HALF,
    epsilon: float = 1e-5,
    momentum: float = 0.1,
    name: str = "batchnorm_relu",
) -> Graph:
    """Training batchnorm (saving mean/inv_variance, updating running stats) followed by relu, NHWC.
    Epsilon is baked in; momentum is a pass-by-value scalar given at execute."""
    g = Graph(
        name=name, io_data_type=data_type, intermediate_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT
    )
    x = g.tensor(dim=[n, c, hw, hw], stride=nhwc([n, c, hw, hw]), name="X")
    stat = [1, c, 1, 1]
    scale = g.tensor(dim=stat, data_type=DataType.FLOAT, name="scale")
    bias = g.tensor(dim=stat, data_type=DataType.FLOAT, name="bias")
    rmean = g.tensor(dim=stat, data_type=DataType.FLOAT, name="running_mean")
    rvar = g.tensor(dim=stat, data_type=DataType.FLOAT, name="running_var")
    mom = g.tensor(dim=[1], data_type=DataType.FLOAT, is_pass_by_value=True, name="momentum")
    y, mean, inv_var, next_mean, next_var = g.batchnorm(
        x, scale, bias, in_running_mean=rmean, in_running_var=rvar, epsilon=epsilon, momentum=mom, name="bn"
    )
    mean.set_output(True).set_name("mean")
    inv_var.set_output(True).set_name("inv_variance")
    next_mean.set_output(True).set_name("next_running_mean")
    next_var.set_output(True).set_name("next_running_var")
    g.relu(y, name="relu").set_output(True).set_name("Y")
    return g
