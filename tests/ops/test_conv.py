"""conv_fprop / conv_dgrad / conv_wgrad: the graph API end to end on the reference engine, against
PyTorch in float64 (asymmetric padding through F.pad, CONVOLUTION mode through a flipped filter),
plus shape inference, one test per validation rule, and a fused conv -> bias -> relu graph."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest

import opgraph as og
from opgraph import ConvolutionMode, DataType
from opgraph.ops.conv import ConvGeometry, conv_data_grad, conv_forward, conv_weight_grad
from opgraph.core.tensor import channels_last_order, packed_strides
from tests.helpers import compare, run_reference, torch_or_skip

CROSS, CONV = ConvolutionMode.CROSS_CORRELATION, ConvolutionMode.CONVOLUTION


@dataclass(frozen=True)
class Case:
    id: str
    n: int
    c: int
    k: int
    x: tuple[int, ...]  # image spatial dims
    r: tuple[int, ...]  # filter taps
    pre: tuple[int, ...]
    post: tuple[int, ...]
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    mode: ConvolutionMode = CROSS

    def __post_init__(self) -> None:
        ones = (1,) * len(self.x)
        object.__setattr__(self, "stride", self.stride or ones)
        object.__setattr__(self, "dilation", self.dilation or ones)

    @property
    def nsp(self) -> int:
        return len(self.x)

    @property
    def y(self) -> tuple[int, ...]:
        return tuple(
            (x + p0 + p1 - ((r - 1) * d + 1)) // s + 1
            for x, r, p0, p1, s, d in zip(self.x, self.r, self.pre, self.post, self.stride, self.dilation)
        )

    def dims(self) -> dict[str, tuple[int, ...]]:
        return {
            "X": (self.n, self.c, *self.x),
            "W": (self.k, self.c // self.groups, *self.r),
            "DY": (self.n, self.k, *self.y),
        }

    def kwargs(self) -> dict:
        """Builder arguments: symmetric `padding` where it can be, else pre/post_padding."""
        pad = (
            {"padding": list(self.pre)}
            if self.pre == self.post
            else {"pre_padding": list(self.pre), "post_padding": list(self.post)}
        )
        return {**pad, "stride": list(self.stride), "dilation": list(self.dilation), "convolution_mode": self.mode}

    def needs_dims(self, op: str) -> bool:
        """Whether the gradient output's dims are left open (groups, or a stride with several inverses)."""
        if op == "conv_dgrad":
            return self.groups > 1 or any(s > 1 for s in self.stride)
        if op == "conv_wgrad":
            return self.groups > 1 or any(s > d for s, d in zip(self.stride, self.dilation))
        return False


CASES = [
    Case("1d", 2, 4, 6, (11,), (3,), (1,), (1,)),
    Case("1d_s3_d2_g3_asym_conv", 2, 6, 9, (17,), (3,), (2,), (0,), (3,), (2,), groups=3, mode=CONV),
    Case("2d", 2, 4, 8, (9, 10), (3, 3), (1, 1), (1, 1)),
    Case("2d_stride2", 2, 4, 8, (9, 10), (3, 3), (1, 1), (1, 1), (2, 2)),
    Case("2d_dilation", 1, 3, 4, (11, 9), (3, 2), (2, 1), (2, 1), dilation=(2, 3)),
    Case("2d_stride_dilation", 2, 4, 4, (13, 12), (3, 3), (0, 1), (0, 1), (2, 3), (2, 1)),
    Case("2d_groups", 2, 6, 4, (8, 7), (3, 3), (1, 1), (1, 1), groups=2),
    Case("2d_depthwise", 2, 4, 8, (8, 8), (3, 3), (1, 1), (1, 1), groups=4),
    Case("2d_asym_pad", 2, 3, 5, (8, 9), (3, 3), (0, 2), (1, 0)),
    Case("2d_convolution", 2, 3, 5, (7, 8), (3, 2), (1, 0), (1, 1), mode=CONV),
    Case("2d_1x1_stride2", 2, 8, 4, (8, 8), (1, 1), (0, 0), (0, 0), (2, 2)),
    Case("3d", 1, 2, 3, (5, 6, 4), (3, 2, 2), (1, 0, 1), (1, 1, 0), (1, 2, 1), (1, 1, 2)),
    Case("3d_groups_conv", 2, 4, 4, (4, 5, 5), (2, 3, 3), (0, 1, 1), (0, 1, 1), (2, 1, 1), groups=2, mode=CONV),
]
OPS = ("conv_fprop", "conv_dgrad", "conv_wgrad")
INPUTS = {"conv_fprop": ("X", "W"), "conv_dgrad": ("DY", "W"), "conv_wgrad": ("X", "DY")}
OUTPUT = {"conv_fprop": "DY", "conv_dgrad": "X", "conv_wgrad": "W"}  # which dims each op produces


# -- PyTorch float64 references ----------------------------------------------------------------------


def _torch_pad(case: Case) -> list[int]:
    """F.pad's argument: (pre, post) pairs from the last spatial axis to the first."""
    return [p for p0, p1 in reversed(list(zip(case.pre, case.post))) for p in (p0, p1)]


def _flip(t, case: Case):
    return t.flip(dims=list(range(2, 2 + case.nsp))) if case.mode is CONV else t


def torch_conv(op: str, case: Case, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    torch = torch_or_skip()
    F, grad = torch.nn.functional, torch.nn.grad
    a, b = torch.from_numpy(a), torch.from_numpy(b)
    geo = dict(stride=case.stride, dilation=case.dilation, groups=case.groups)
    if op == "conv_fprop":
        return getattr(F, f"conv{case.nsp}d")(F.pad(a, _torch_pad(case)), _flip(b, case), **geo).numpy()
    if op == "conv_dgrad":
        padded = (case.n, case.c, *(x + p0 + p1 for x, p0, p1 in zip(case.x, case.pre, case.post)))
        dxp = getattr(grad, f"conv{case.nsp}d_input")(padded, _flip(b, case), a, padding=0, **geo)
        crop = (slice(None), slice(None), *(slice(p0, p0 + x) for p0, x in zip(case.pre, case.x)))
        return dxp[crop].numpy()
    dw = getattr(grad, f"conv{case.nsp}d_weight")(F.pad(a, _torch_pad(case)), case.dims()["W"], b, padding=0, **geo)
    return _flip(dw, case).numpy()


# -- the graph runner -------------------------------------------------------------------------------


def layout_strides(dim: tuple[int, ...], layout: str) -> tuple[int, ...]:
    return packed_strides(dim, channels_last_order(len(dim)) if layout == "nhwc" else None)


def check_op(
    op: str,
    case: Case,
    rng: np.random.Generator,
    *,
    layout: str = "nchw",
    io: DataType = DataType.FLOAT,
    out_type: DataType | None = None,
) -> None:
    """Build a one-op graph, run it with random inputs and a poisoned output, compare with PyTorch."""
    compute = DataType.INT32 if io.is_integer else DataType.FLOAT
    g = og.Graph(io_data_type=io, intermediate_data_type=DataType.FLOAT, compute_data_type=compute)
    dims = case.dims()
    a, b = (g.tensor(dim=dims[n], stride=layout_strides(dims[n], layout), name=n) for n in INPUTS[op])
    out = getattr(g, op)(a, b, **case.kwargs(), name="conv").set_output(True)
    if out_type is not None:
        out.set_data_type(out_type)
    if case.needs_dims(op):
        out.set_dim(dims[OUTPUT[op]])
    pack, _ = run_reference(g, rng)
    want = torch_conv(op, case, *(np.array(pack[t.uid], dtype=np.float64) for t in (a, b)))
    desc = g.final.tensors[out.uid]
    assert desc.dim == want.shape == dims[OUTPUT[op]]
    assert desc.stride == layout_strides(desc.dim, layout)  # the output follows the image's layout
    mismatch = compare(desc, pack[out.uid], want)
    assert mismatch is None, str(mismatch)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("op", OPS)
def test_against_torch(op, case, layout, rng):
    check_op(op, case, rng, layout=layout)


DTYPE_CASE = Case("2d_groups_stride", 2, 4, 6, (7, 8), (3, 2), (1, 0), (1, 1), (2, 1), groups=2)


@pytest.mark.parametrize(
    ("io", "out_type"),
    [
        (DataType.FLOAT, None),
        (DataType.HALF, None),
        (DataType.BFLOAT16, None),
        (DataType.FP8_E4M3, DataType.FLOAT),
        (DataType.INT8, DataType.INT32),
        (DataType.UINT8, DataType.INT32),
    ],
    ids=["f32", "f16", "bf16", "fp8_to_f32", "i8_to_i32", "u8_to_i32"],
)
@pytest.mark.parametrize("op", OPS)
def test_dtypes(op, io, out_type, rng):
    # Low-precision inputs are random values of that type; PyTorch computes on the same values in
    # float64, so only the rounding of the output differs (exact for integer outputs).
    check_op(op, DTYPE_CASE, rng, layout="nhwc", io=io, out_type=out_type)


def test_fused_conv_bias_relu(rng):
    torch = torch_or_skip()
    g = og.Graph(io_data_type=DataType.FLOAT, intermediate_data_type=DataType.FLOAT)
    x = g.tensor(dim=[2, 4, 9, 9], stride=layout_strides((2, 4, 9, 9), "nhwc"), name="X")
    w = g.tensor(dim=[6, 4, 3, 3], stride=layout_strides((6, 4, 3, 3), "nhwc"), name="W")
    bias = g.tensor(dim=[1, 6, 1, 1], name="B")
    conv = g.conv_fprop(x, w, padding=[1, 1], stride=[2, 2], name="conv")
    biased = g.bias(conv, bias, name="bias")
    y = g.relu(biased, name="relu").set_output(True)
    pack, _ = run_reference(g, rng)
    assert conv.is_virtual and biased.is_virtual and g.final.outputs == (y.uid,)
    X, W, B = (torch.from_numpy(np.array(pack[t.uid], dtype=np.float64)) for t in (x, w, bias))
    want = torch.relu(torch.nn.functional.conv2d(X, W, padding=1, stride=2) + B).numpy()
    desc = g.final.tensors[y.uid]
    assert desc.dim == (2, 6, 5, 5) and desc.layout == "nhwc"
    assert (mismatch := compare(desc, pack[y.uid], want)) is None, str(mismatch)


# -- shape inference and builder arguments ----------------------------------------------------------


def _graph(**dims) -> tuple[og.Graph, dict[str, og.Tensor]]:
    g = og.Graph(io_data_type=DataType.FLOAT)
    return g, {name: g.tensor(dim=d, name=name) for name, d in dims.items()}


def test_fprop_infers_dims_and_layout():
    g = og.Graph()
    x = g.tensor(dim=[2, 8, 15, 16], stride=layout_strides((2, 8, 15, 16), "nhwc"), name="X")
    w = g.tensor(dim=[4, 8, 3, 3], name="W")
    y = g.conv_fprop(x, w, padding=1, stride=2, dilation=[2, 1]).set_output(True)
    g.validate()
    assert y.dim == (2, 4, 7, 8) and y.stride == layout_strides((2, 4, 7, 8), "nhwc")


def test_scalar_and_default_arguments_expand_per_spatial_dim():
    g, t = _graph(X=[1, 2, 5, 5, 5], W=[3, 2, 1, 1, 1])
    g.conv_fprop(t["X"], t["W"], padding=1, stride=2, convolution_mode="convolution").set_output(True)
    op = g.final.nodes[0].op
    assert (op.pre_padding, op.post_padding, op.stride, op.dilation) == ((1,) * 3, (1,) * 3, (2,) * 3, (1,) * 3)
    assert op.convolution_mode is CONV


def test_pre_padding_alone_leaves_post_padding_zero():
    g, t = _graph(X=[1, 2, 6], W=[3, 2, 3])
    y = g.conv_fprop(t["X"], t["W"], pre_padding=[2]).set_output(True)
    assert g.final.nodes[0].op.post_padding == (0,) and y.dim == (1, 3, 6)


def test_dgrad_infers_dims_when_unique():
    g, t = _graph(DY=[2, 4, 6, 7], W=[4, 3, 3, 3])
    dx = g.conv_dgrad(t["DY"], t["W"], padding=[1, 1]).set_output(True)
    g.validate()
    assert dx.dim == (2, 3, 6, 7)
    # stride 2, but padding leaves a single image size >= 1: (1-1)*2 + 1 - 1 = 0 or 1 -> 1
    g, t = _graph(DY=[1, 2, 1], W=[2, 2, 1])
    dx = g.conv_dgrad(t["DY"], t["W"], pre_padding=[1], post_padding=[0], stride=[2]).set_output(True)
    g.validate()
    assert dx.dim == (1, 2, 1)


def test_wgrad_infers_dims_with_one_group_unless_set():
    g, t = _graph(X=[2, 6, 9, 9], DY=[2, 4, 9, 9])
    dw = g.conv_wgrad(t["X"], t["DY"], padding=1).set_output(True)
    g.validate()
    assert dw.dim == (4, 6, 3, 3)
    dw.set_dim([4, 3, 3, 3])  # two groups: accepted as set
    g.validate()
    assert dw.dim == (4, 3, 3, 3)


def test_json_round_trip():
    g, t = _graph(X=[1, 4, 8, 8], W=[4, 2, 3, 2])
    g.conv_fprop(
        t["X"], t["W"], pre_padding=[0, 1], post_padding=[2, 0], stride=[2, 1], convolution_mode=CONV
    ).set_output(True)
    again = og.Graph.from_json(g.to_json())
    assert again.final.nodes[0].op == g.final.nodes[0].op


def test_reference_is_fast_enough():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 16, 16, 16)), rng.standard_normal((16, 16, 3, 3))
    geo = ConvGeometry((1, 1), (1, 1), (1, 1), (1, 1))
    start = time.perf_counter()
    y = conv_forward(x, w, geo, CROSS)
    conv_data_grad(y, w, x.shape, geo, CROSS)
    conv_weight_grad(x, y, w.shape, geo, CROSS)
    assert time.perf_counter() - start < 0.6  # 0.2 s per op


# -- one test per validation rule ---------------------------------------------------------------------


def expect_error(g: og.Graph, cls: type[og.GraphError], rule: str, tensor: str) -> og.GraphError:
    with pytest.raises(cls) as info:
        g.validate()
    err = info.value
    assert err.rule == rule, str(err)
    assert f"[rule {rule}]" in str(err) and f"'{tensor}'" in str(err), str(err)
    assert err.hint
    return err


@pytest.mark.parametrize(
    ("x", "w", "bad"),
    [([8, 16], [4, 8], "X"), ([1, 8, 4, 4, 4, 4], [4, 8, 1, 1, 1, 1], "X"), ([1, 8, 4, 4], [4, 8, 3], "W")],
)
def test_rank(x, w, bad):
    g, t = _graph(X=x, W=w)
    g.conv_fprop(t["X"], t["W"], padding=[0] * max(len(x) - 2, 1)).set_output(True)
    expect_error(g, og.ShapeError, "conv.rank", bad)


def test_attr_length():
    g, t = _graph(X=[1, 8, 4, 4], W=[4, 8, 3, 3])
    g.conv_fprop(t["X"], t["W"], padding=[1]).set_output(True)
    assert "padding [1]" in str(expect_error(g, og.AttributeValueError, "conv.attr_length", "X"))


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"padding": [-1, 0]}, "conv.padding"),
        ({"pre_padding": [0, 0], "post_padding": [0, -2]}, "conv.padding"),
        ({"stride": [1, 0]}, "conv.stride"),
        ({"dilation": 0}, "conv.dilation"),
    ],
)
def test_attr_values(kwargs, rule):
    g, t = _graph(X=[1, 8, 4, 4], W=[4, 8, 3, 3])
    g.conv_fprop(t["X"], t["W"], **kwargs).set_output(True)
    expect_error(g, og.AttributeValueError, rule, "X")


def test_negative_padding_hint():
    g, t = _graph(X=[1, 8, 4, 4], W=[4, 8, 3, 3])
    g.conv_fprop(t["X"], t["W"], padding=-1).set_output(True)
    assert "not supported" in expect_error(g, og.AttributeValueError, "conv.padding", "X").hint


def test_output_size():
    g, t = _graph(X=[1, 8, 4, 4], W=[4, 8, 3, 3])
    g.conv_fprop(t["X"], t["W"], dilation=[2, 1]).set_output(True)
    assert "[0, 2]" in str(expect_error(g, og.ShapeError, "conv.output_size", "X"))


def test_channels():
    g, t = _graph(X=[1, 6, 4, 4], W=[4, 4, 3, 3])
    g.conv_fprop(t["X"], t["W"]).set_output(True)
    expect_error(g, og.ShapeError, "conv.channels", "W")


def test_groups():
    g, t = _graph(X=[1, 4, 4, 4], W=[3, 2, 3, 3])  # 2 groups, 3 filters
    g.conv_fprop(t["X"], t["W"]).set_output(True)
    expect_error(g, og.ShapeError, "conv.groups", "W")


def test_dgrad_channels_of_set_dims():
    g, t = _graph(DY=[1, 4, 4, 4], W=[4, 3, 3, 3])
    g.conv_dgrad(t["DY"], t["W"], padding=1, name="dg").set_output(True).set_dim([1, 5, 4, 4])
    expect_error(g, og.ShapeError, "conv.channels", "dg::DX")


def test_out_channels():
    g, t = _graph(DY=[1, 5, 4, 4], W=[4, 3, 3, 3])
    g.conv_dgrad(t["DY"], t["W"], padding=1).set_output(True)
    expect_error(g, og.ShapeError, "conv.out_channels", "DY")
    g, t = _graph(X=[1, 4, 4, 4], DY=[1, 6, 4, 4])
    g.conv_wgrad(t["X"], t["DY"], padding=1, name="wg").set_output(True).set_dim([5, 4, 3, 3])
    expect_error(g, og.ShapeError, "conv.out_channels", "wg::DW")


def test_batch():
    g, t = _graph(X=[2, 4, 4, 4], DY=[3, 6, 4, 4])
    g.conv_wgrad(t["X"], t["DY"], padding=1).set_output(True)
    expect_error(g, og.ShapeError, "conv.batch", "DY")
    g, t = _graph(DY=[3, 6, 4, 4], W=[6, 4, 3, 3])
    g.conv_dgrad(t["DY"], t["W"], padding=1).set_output(True).set_dim([2, 4, 4, 4])
    expect_error(g, og.ShapeError, "conv.batch", "DY")


@pytest.mark.parametrize("op", ["conv_dgrad", "conv_wgrad", "conv_wgrad_unset"])
def test_loss_dims(op):
    # forward: 8x8 image, 3x3 filter, padding 1, stride 2 -> 4x4; the loss here is 5x5
    if op == "conv_dgrad":
        g, t = _graph(DY=[1, 6, 5, 5], W=[6, 4, 3, 3])
        g.conv_dgrad(t["DY"], t["W"], padding=1, stride=2).set_output(True).set_dim([1, 4, 8, 8])
    else:
        g, t = _graph(X=[1, 4, 8, 8], DY=[1, 6, 5, 5] if op == "conv_wgrad" else [1, 6, 12, 12])
        dw = g.conv_wgrad(t["X"], t["DY"], padding=1, stride=2).set_output(True)
        if op == "conv_wgrad":
            dw.set_dim([6, 4, 3, 3])
    expect_error(g, og.ShapeError, "conv.loss_dims", "DY")


def test_ambiguous_dims():
    g, t = _graph(DY=[1, 6, 4, 4], W=[6, 4, 3, 3])
    g.conv_dgrad(t["DY"], t["W"], padding=1, stride=2, name="dg").set_output(True)
    assert "7..8" in str(expect_error(g, og.ShapeError, "conv.ambiguous_dims", "dg::DX"))
    g, t = _graph(X=[1, 4, 8, 8], DY=[1, 6, 4, 4])
    g.conv_wgrad(t["X"], t["DY"], padding=1, stride=2, name="wg").set_output(True)
    expect_error(g, og.ShapeError, "conv.ambiguous_dims", "wg::DW")


@pytest.mark.parametrize(
    ("x_type", "w_type", "out_type", "bad", "rule"),
    [
        (DataType.BOOLEAN, DataType.BOOLEAN, DataType.FLOAT, "X", "conv.data_type"),
        (DataType.INT32, DataType.INT32, DataType.INT32, "X", "conv.data_type"),
        (DataType.HALF, DataType.HALF, DataType.INT32, "conv::Y", "conv.data_type"),
        (DataType.INT8, DataType.INT8, DataType.BOOLEAN, "conv::Y", "conv.data_type"),
        (DataType.HALF, DataType.INT8, DataType.FLOAT, "W", "conv.mixed_types"),
    ],
)
def test_data_types(x_type, w_type, out_type, bad, rule):
    g = og.Graph()
    x = g.tensor(dim=[1, 4, 5, 5], data_type=x_type, name="X")
    w = g.tensor(dim=[2, 4, 3, 3], data_type=w_type, name="W")
    g.conv_fprop(x, w, name="conv").set_output(True).set_data_type(out_type)
    expect_error(g, og.DataTypeError, rule, bad)


def test_int8_to_float_output_is_allowed():
    g = og.Graph()
    x = g.tensor(dim=[1, 4, 5, 5], data_type=DataType.INT8, name="X")
    w = g.tensor(dim=[2, 4, 3, 3], data_type=DataType.UINT8, name="W")
    g.conv_fprop(x, w).set_output(True).set_data_type(DataType.FLOAT)
    g.validate()


# Builder-time argument errors: no tensor is at fault, so they name the op and the argument.


def test_padding_args_both_given():
    g, t = _graph(X=[1, 4, 5, 5], W=[2, 4, 3, 3])
    with pytest.raises(og.AttributeValueError) as info:
        g.conv_fprop(t["X"], t["W"], padding=[1, 1], pre_padding=[1, 1], name="c")
    assert info.value.rule == "conv.padding_args" and "conv_fprop 'c'" in str(info.value)


@pytest.mark.parametrize(
    "kwargs", [{"padding": 1.5}, {"stride": [1, "2"]}, {"dilation": True}, {"convolution_mode": "flip"}]
)
def test_attr_type(kwargs):
    g, t = _graph(X=[1, 4, 5, 5], W=[2, 4, 3, 3])
    with pytest.raises(og.AttributeValueError) as info:
        g.conv_fprop(t["X"], t["W"], **kwargs)
    assert info.value.rule == "conv.attr_type" and "[rule conv.attr_type]" in str(info.value)


def test_scalar_attrs_expand_once_the_rank_is_known():
    g, t = _graph(X=[1, 4, 5, 5], W=[2, 4, 3, 3])
    x, w = g.relu(t["X"]), g.relu(t["W"])  # op outputs: no dims before validation
    y = g.conv_fprop(x, w, padding=1, stride=2, name="c").set_output(True)
    g.validate()
    assert y.dim == (1, 2, 3, 3)
    node = next(n for n in g.final.nodes if n.kind == "conv_fprop")
    assert node.op.pre_padding == (1, 1) and node.op.stride == (2, 2) and node.op.dilation == (1, 1)
    # the same conv given lists has the same attributes, hence the same graph key
    g2, t2 = _graph(X=[1, 4, 5, 5], W=[2, 4, 3, 3])
    g2.conv_fprop(g2.relu(t2["X"]), g2.relu(t2["W"]), padding=[1, 1], stride=[2, 2], name="c").set_output(True)
    assert [n.op for n in g2.final.nodes] == [n.op for n in g.final.nodes]
