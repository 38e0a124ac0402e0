"""Convolutions: conv_fprop, conv_dgrad, conv_wgrad (1-D/2-D/3-D, groups, padding, stride, dilation).

Logical dims: image X [N, C, x...], filter W [K, C/G, r...], output/loss Y [N, K, y...]. The number of
groups G is implied by the filter: G = C / W.dim[1] (depthwise when W.dim[1] == 1). Per spatial axis,
with pre/post padding p0/p1, stride s and dilation d:

    y = (x + p0 + p1 - ((r - 1) * d + 1)) // s + 1

Below, X^ is X zero-padded (X^[.., i] = X[.., i - p0], 0 outside), channels split into G groups
(input channel c = g*Cg + c', output channel k in group g = k // (K/G)), and W' is W in
CROSS_CORRELATION mode or W flipped in every spatial axis in CONVOLUTION mode. Index sums over
spatial axes are per axis (o*s + r*d means the vector of o_i*s_i + r_i*d_i).

NaN and infinities (docs/concepts.md, "NaN, infinities and overflow"): IEEE arithmetic of these sums.
A NaN among an output element's terms (its window of X, its filter taps; DY and W for dgrad, X and DY
for wgrad) makes it NaN, inf * 0 is NaN, +inf and -inf among the terms give NaN, an exact sum beyond
the output type is +-inf; where summation order decides (a partial sum passing the compute type's
range, inf - inf in some orders) either answer is correct. Padding is not data: a term 0 * v with the
0 a padding position (fprop, wgrad) or a tap meeting no DY element (dgrad: borders, stride holes) may
be computed (NaN for a NaN or infinite v) or left out; the reference computes it for fprop and wgrad
(X^ is zero-padded) and leaves it out for dgrad (only the (o, r) pairs that meet are summed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.op import Draft, NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import Tensor, TensorDesc
from .base import batch_only_refusal, strides_like
from .conv_math import (
    INPUT_TYPES,
    ConvGeometry,
    ConvolutionMode,
    conv_data_grad,
    conv_forward,
    conv_weight_grad,
    pick_sizes,
    spans_text,
)

# -- the ops ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Conv(Op):
    """Attributes and rules shared by the three convolution ops. An empty tuple means the default
    for every spatial axis (padding 0, stride 1, dilation 1), as cuDNN's empty lists do."""

    pre_padding: tuple[int, ...] | int = ()
    post_padding: tuple[int, ...] | int = ()
    stride: tuple[int, ...] | int = ()
    dilation: tuple[int, ...] | int = ()
    convolution_mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION

    def normalize(self, ctx: NodeContext) -> _Conv:
        """Expand defaults (empty tuples) and one-int-for-every-dim values to full tuples."""
        first = ctx.input(self.INPUTS[0])
        if not isinstance(first, TensorDesc) or not 3 <= len(first.dim) <= 5:
            return self  # infer reports the rank
        geo = self.geometry(len(first.dim) - 2)
        return dataclasses.replace(
            self, pre_padding=geo.pre, post_padding=geo.post, stride=geo.stride, dilation=geo.dilation
        )

    def geometry(self, nsp: int) -> ConvGeometry:
        """The attributes resolved for `nsp` spatial axes (no checks: see `_checked_geometry`)."""

        def full(values: tuple[int, ...] | int, default: int) -> tuple[int, ...]:
            if isinstance(values, int):
                return (values,) * nsp
            return values if values else (default,) * nsp

        return ConvGeometry(
            full(self.pre_padding, 0), full(self.post_padding, 0), full(self.stride, 1), full(self.dilation, 1)
        )

    def _checked_ranks(self, ctx: NodeContext) -> tuple[TensorDesc, TensorDesc]:
        """Both inputs, of equal rank 3..5 (the first input sets the rank)."""
        first, second = self.INPUTS
        a, b = ctx.tensor(first), ctx.tensor(second)
        if not 3 <= len(a.dim) <= 5:
            ctx.error(
                ShapeError,
                f"input '{first}' has rank {len(a.dim)} (dims {list(a.dim)}); convolutions take "
                "rank 3, 4 or 5 ([N, C, W], [N, C, H, W] or [N, C, D, H, W])",
                tensor=first,
                rule="conv.rank",
                hint="give the tensor one batch axis, one channel axis and 1 to 3 spatial axes (use "
                "a spatial dim of 1 for a lower-dimensional conv)",
            )
        if len(b.dim) != len(a.dim):
            ctx.error(
                ShapeError,
                f"input '{second}' has rank {len(b.dim)} (dims {list(b.dim)}) but '{first}' has rank {len(a.dim)}",
                tensor=second,
                rule="conv.rank",
                hint="image, filter and loss of a convolution all have the same rank",
            )
        return a, b

    def _checked_geometry(self, ctx: NodeContext, nsp: int) -> ConvGeometry:
        role = self.INPUTS[0]
        for attr in ("pre_padding", "post_padding", "stride", "dilation"):
            values = getattr(self, attr)
            if isinstance(values, tuple) and values and len(values) != nsp:
                ctx.error(
                    AttributeValueError,
                    f"{attr} {list(values)} has {len(values)} value(s) but the convolution has {nsp} spatial dim(s)",
                    tensor=role,
                    rule="conv.attr_length",
                    hint=f"give {attr} one value per spatial dim ({nsp})",
                )
        geo = self.geometry(nsp)
        if any(v < 0 for v in geo.pre + geo.post):
            ctx.error(
                AttributeValueError,
                f"padding must be >= 0, got pre_padding {list(geo.pre)}, post_padding {list(geo.post)}",
                tensor=role,
                rule="conv.padding",
                hint="negative padding (cropping) is not supported: slice the image first, or use 0",
            )
        if any(v < 1 for v in geo.stride):
            ctx.error(
                AttributeValueError,
                f"stride must be >= 1, got {list(geo.stride)}",
                tensor=role,
                rule="conv.stride",
                hint="use stride 1 for a dense convolution",
            )
        if any(v < 1 for v in geo.dilation):
            ctx.error(
                AttributeValueError,
                f"dilation must be >= 1, got {list(geo.dilation)}",
                tensor=role,
                rule="conv.dilation",
                hint="use dilation 1 for an undilated filter",
            )
        return geo

    def _check_groups(self, ctx: NodeContext, c: int, cg: int, k: int, role: str) -> None:
        """C must split into groups of the filter's channel count, and K over the groups."""
        if c % cg:
            ctx.error(
                ShapeError,
                f"the image has {c} channels, which is not a multiple of the filter's {cg} channels per group",
                tensor=role,
                rule="conv.channels",
                hint="filter dims are [K, C/groups, ...]: use C for a plain conv, 1 for depthwise, or a divisor of C",
            )
        groups = c // cg
        if k % groups:
            ctx.error(
                ShapeError,
                f"{k} output channels do not split over {groups} groups (image channels {c} / filter channels {cg})",
                tensor=role,
                rule="conv.groups",
                hint=f"make the number of filters K a multiple of {groups}",
            )

    def _check_batch(self, ctx: NodeContext, a: Sequence[int], b: Sequence[int], role: str, other: str) -> None:
        if a[0] != b[0]:
            ctx.error(
                ShapeError,
                f"batch size {b[0]} of '{role}' does not match batch size {a[0]} of '{other}'",
                tensor=role,
                rule="conv.batch",
                hint="use the same N for image and loss",
            )

    def _check_loss(
        self, ctx: NodeContext, geo: ConvGeometry, x: Sequence[int], r: Sequence[int], y: Sequence[int], role: str
    ) -> None:
        want = geo.out_size(x, r)
        if tuple(y) != want:
            ctx.error(
                ShapeError,
                f"loss spatial dims {list(y)} do not match the forward convolution of image spatial "
                f"dims {list(x)} with filter {list(r)} ({geo.describe()}), which gives {list(want)}",
                tensor=role,
                rule="conv.loss_dims",
                hint="use the padding, stride and dilation of the forward conv, and its image and filter dims",
            )

    def _unique_sizes(
        self, ctx: NodeContext, spans: list[tuple[int, int]], what: str, fits: str, set_dims: str
    ) -> tuple[int, ...]:
        """The one spatial size per axis that `spans` allows (the forward formula inverted)."""
        if any(lo > hi for lo, hi in spans):
            ctx.error(
                ShapeError,
                f"no {what} size fits {fits}",
                tensor="loss",
                rule="conv.loss_dims",
                hint="use the padding, stride and dilation of the forward conv",
            )
        sizes = pick_sizes(spans)
        if sizes is None:
            out = self.OUTPUTS[0]
            ctx.error(
                ShapeError,
                f"the {what} spatial dims are not determined: with this stride several sizes fit "
                f"{fits} (per axis: {spans_text(spans)})",
                tensor=out,
                rule="conv.ambiguous_dims",
                hint=f"set the forward {what} dims on {out}: .set_dim({set_dims})",
            )
        return sizes

    def _check_types(self, ctx: NodeContext) -> None:
        for role in self.INPUTS:
            dt = ctx.tensor(role).data_type
            if dt not in INPUT_TYPES:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' has data type {dt.name}, which convolutions do not take",
                    tensor=role,
                    rule="conv.data_type",
                    hint="use a float type (FLOAT, HALF, BFLOAT16, DOUBLE, FP8) or INT8/UINT8",
                )
        first, second = (ctx.tensor(r).data_type for r in self.INPUTS)
        if first.is_floating != second.is_floating:
            ctx.error(
                DataTypeError,
                f"inputs mix float and integer types ('{self.INPUTS[0]}' {first.name}, "
                f"'{self.INPUTS[1]}' {second.name})",
                tensor=self.INPUTS[1],
                rule="conv.mixed_types",
                hint="make both inputs float, or both INT8/UINT8 (quantize or cast one of them)",
            )
        role = self.OUTPUTS[0]
        out = ctx.output(role)
        assert isinstance(out, TensorDesc)
        if out.data_type is DataType.BOOLEAN or (first.is_floating and out.data_type.is_integer):
            kind = "float" if first.is_floating else "integer"
            ctx.error(
                DataTypeError,
                f"output '{role}' has data type {out.data_type.name}, which a convolution of "
                f"{kind} inputs cannot produce",
                tensor=role,
                rule="conv.data_type",
                hint="use a float output type; integer outputs (e.g. INT32) need INT8/UINT8 inputs",
            )

    def _set_dims(self, ctx: NodeContext) -> tuple[int, ...] | None:
        draft = ctx.output(self.OUTPUTS[0])
        assert isinstance(draft, Draft)
        return draft.dim

    def _check_out_rank(self, ctx: NodeContext, dim: Sequence[int], rank: int) -> None:
        role = self.OUTPUTS[0]
        if len(dim) != rank:
            ctx.error(
                ShapeError,
                f"output '{role}' was set to dims {list(dim)} (rank {len(dim)}) but the inputs have rank {rank}",
                tensor=role,
                rule="conv.rank",
                hint="give the output the rank of the inputs",
            )

    def check(self, ctx: NodeContext) -> None:
        self._check_types(ctx)


@register_op
@dataclass(frozen=True, kw_only=True)
class ConvFprop(_Conv):
    """Forward convolution: Y[n, k, o] = sum over c', r of X^[n, g*Cg + c', o*s + r*d] * W'[k, c', r],
    g = k // (K/G); spatial dims y = (x + p0 + p1 - ((r-1)*d + 1)) // s + 1. Y follows X's layout."""

    kind = "conv_fprop"
    DYNAMIC = True
    INPUTS = ("image", "weight")
    OUTPUTS = ("Y",)

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        return batch_only_refusal(ctx, self.INPUTS, "conv_fprop")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x, w = self._checked_ranks(ctx)
        geo = self._checked_geometry(ctx, len(x.dim) - 2)
        self._check_groups(ctx, x.dim[1], w.dim[1], w.dim[0], "weight")
        out = geo.out_size(x.dim[2:], w.dim[2:])
        if min(out) < 1:
            ctx.error(
                ShapeError,
                f"the output spatial dims would be {list(out)}: image spatial dims {list(x.dim[2:])} "
                f"with filter {list(w.dim[2:])} ({geo.describe()})",
                tensor="image",
                rule="conv.output_size",
                hint="the dilated filter, (r-1)*dilation + 1, must fit in the padded image: pad more, or use "
                "a smaller filter or dilation",
            )
        dim = (x.dim[0], w.dim[0], *out)
        return [TensorSpec(dim, strides_like(dim, x))]

    def reference(self, ins, outs):
        x, w = ins
        return [conv_forward(x, w, self.geometry(x.ndim - 2), self.convolution_mode)]


@register_op
@dataclass(frozen=True, kw_only=True)
class ConvDgrad(_Conv):
    """Data gradient (the gradient of conv_fprop with respect to its image):
    DX[n, c, i] = sum over k in c's group, o, r with o*s + r*d - p0 = i of DY[n, k, o] * W'[k, c', r],
    c = g*Cg + c'. DX's spatial dims are inferred when the forward formula has one inverse,
    x = (y-1)*s + (r-1)*d + 1 - p0 - p1 (always for stride 1); otherwise set them. Its channels are
    inferred as the filter's (groups = 1) unless set. DX follows DY's layout."""

    kind = "conv_dgrad"
    DYNAMIC = True

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        return batch_only_refusal(ctx, self.INPUTS, "conv_dgrad")  # (a dynamic batch of the loss only)

    INPUTS = ("loss", "filter")
    OUTPUTS = ("DX",)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        dy, w = self._checked_ranks(ctx)
        geo = self._checked_geometry(ctx, len(dy.dim) - 2)
        if dy.dim[1] != w.dim[0]:
            ctx.error(
                ShapeError,
                f"the loss has {dy.dim[1]} channels but the filter has {w.dim[0]} filters (K)",
                tensor="loss",
                rule="conv.out_channels",
                hint="the loss of a conv has one channel per filter: dims [N, K, ...] for a filter [K, C/groups, ...]",
            )
        dim = self._set_dims(ctx)
        if dim is None:
            fits = f"loss spatial dims {list(dy.dim[2:])} with filter {list(w.dim[2:])} ({geo.describe()})"
            x = self._unique_sizes(
                ctx, geo.image_sizes(dy.dim[2:], w.dim[2:]), "image", fits, f"[{dy.dim[0]}, C, spatial...]"
            )
            dim = (dy.dim[0], w.dim[1], *x)
        else:
            self._check_out_rank(ctx, dim, len(dy.dim))
            self._check_batch(ctx, dim, dy.dim, "loss", "DX")
            self._check_groups(ctx, dim[1], w.dim[1], w.dim[0], "DX")
            self._check_loss(ctx, geo, dim[2:], w.dim[2:], dy.dim[2:], "loss")
        return [TensorSpec(tuple(dim), strides_like(dim, dy))]

    def reference(self, ins, outs):
        dy, w = ins
        dx = outs[0]
        return [conv_data_grad(dy, w, dx.dim, self.geometry(dy.ndim - 2), self.convolution_mode)]


@register_op
@dataclass(frozen=True, kw_only=True)
class ConvWgrad(_Conv):
    """Filter gradient (the gradient of conv_fprop with respect to its filter):
    DW'[k, c', r] = sum over n, o of DY[n, k, o] * X^[n, g*Cg + c', o*s + r*d], g = k // (K/G);
    DW = DW' in CROSS_CORRELATION mode, DW' flipped in every spatial axis in CONVOLUTION mode.
    DW dims [K, C/G, r...]: image and loss do not determine G, so unless DW's dims are set they are
    inferred with G = 1 and the filter size the forward formula inverts to (unique when
    stride <= dilation). DW follows X's layout."""

    kind = "conv_wgrad"
    DYNAMIC = True

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        # a dynamic batch of the image and of the loss (dim 0 of each: summed over by the wgrad)
        return batch_only_refusal(ctx, ("image",), "conv_wgrad") or batch_only_refusal(ctx, ("loss",), "conv_wgrad")

    INPUTS = ("image", "loss")
    OUTPUTS = ("DW",)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x, dy = self._checked_ranks(ctx)
        geo = self._checked_geometry(ctx, len(x.dim) - 2)
        self._check_batch(ctx, x.dim, dy.dim, "loss", "image")
        dim = self._set_dims(ctx)
        if dim is None:
            fits = f"image spatial dims {list(x.dim[2:])} and loss spatial dims {list(dy.dim[2:])} ({geo.describe()})"
            taps = self._unique_sizes(
                ctx, geo.filter_sizes(x.dim[2:], dy.dim[2:]), "filter", fits, f"[{dy.dim[1]}, C/groups, taps...]"
            )
            dim = (dy.dim[1], x.dim[1], *taps)
        else:
            self._check_out_rank(ctx, dim, len(x.dim))
            if dim[0] != dy.dim[1]:
                ctx.error(
                    ShapeError,
                    f"DW was set to {dim[0]} filters (K) but the loss has {dy.dim[1]} channels",
                    tensor="DW",
                    rule="conv.out_channels",
                    hint=f"the filter gradient has dims [K, C/groups, ...] with K = {dy.dim[1]}",
                )
            self._check_groups(ctx, x.dim[1], dim[1], dim[0], "DW")
            self._check_loss(ctx, geo, x.dim[2:], dim[2:], dy.dim[2:], "loss")
        return [TensorSpec(tuple(dim), strides_like(dim, x))]

    def reference(self, ins, outs):
        x, dy = ins
        dw = outs[0]
        return [conv_weight_grad(x, dy, dw.dim, self.geometry(x.ndim - 2), self.convolution_mode)]


# -- builders (names and keyword arguments as in cuDNN frontend's Python API) -----------------------

IntOrInts = int | Sequence[int] | None


def _spatial_rank(tensors: Sequence[Any]) -> int | None:
    """The number of spatial dims, from the first input whose dims are known at build time."""
    for t in tensors:
        if isinstance(t, Tensor) and t.dim is not None:
            return max(len(t.dim) - 2, 1)
    return None


def _ints(value: IntOrInts, default: int, what: str, nsp: int | None, label: str) -> tuple[int, ...]:
    """A per-spatial-dim tuple from None (the default), an int (for every dim) or a sequence."""

    def bad() -> AttributeValueError:
        return AttributeValueError(
            f"{what} must be an int or a list of ints, got {value!r}",
            op=label,
            rule="conv.attr_type",
            hint=f"pass {what} as a list with one int per spatial dim, e.g. [1, 1]",
        )

    if value is None or isinstance(value, (int, np.integer)):
        if isinstance(value, bool):
            raise bad()
        if nsp is None:  # expanded by normalize() at validation, once the rank is known
            return () if value is None else int(value)  # type: ignore[return-value]
        return (default if value is None else int(value),) * nsp
    try:
        items = tuple(value)
    except TypeError:
        raise bad() from None
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise bad()
    return tuple(int(v) for v in items)


def _conv_attrs(
    kind: str,
    name: str,
    inputs: Sequence[Any],
    padding: IntOrInts,
    pre_padding: IntOrInts,
    post_padding: IntOrInts,
    stride: IntOrInts,
    dilation: IntOrInts,
    convolution_mode: Any,
) -> dict[str, Any]:
    label = f"{kind} '{name or '<unnamed>'}'"
    if padding is not None and (pre_padding is not None or post_padding is not None):
        raise AttributeValueError(
            "both padding and pre_padding/post_padding were given",
            op=label,
            rule="conv.padding_args",
            hint="pass padding (symmetric) or pre_padding and post_padding (asymmetric), not both",
        )
    if padding is not None:
        pre_padding = post_padding = padding
    if isinstance(convolution_mode, str):
        key = convolution_mode.strip().upper()
        if key not in ConvolutionMode.__members__:
            raise AttributeValueError(
                f"convolution_mode={convolution_mode!r} is not a convolution mode",
                op=label,
                rule="conv.attr_type",
                hint="use ConvolutionMode.CROSS_CORRELATION or ConvolutionMode.CONVOLUTION",
            )
        convolution_mode = ConvolutionMode[key]
    if not isinstance(convolution_mode, ConvolutionMode):
        raise AttributeValueError(
            f"convolution_mode={convolution_mode!r} is not a ConvolutionMode",
            op=label,
            rule="conv.attr_type",
            hint="use ConvolutionMode.CROSS_CORRELATION or ConvolutionMode.CONVOLUTION",
        )
    nsp = _spatial_rank(inputs)
    return dict(
        pre_padding=_ints(pre_padding, 0, "pre_padding", nsp, label),
        post_padding=_ints(post_padding, 0, "post_padding", nsp, label),
        stride=_ints(stride, 1, "stride", nsp, label),
        dilation=_ints(dilation, 1, "dilation", nsp, label),
        convolution_mode=convolution_mode,
    )


@graph_method
def conv_fprop(
    self,
    image: Tensor,
    weight: Tensor,
    padding: IntOrInts = None,
    stride: IntOrInts = None,
    dilation: IntOrInts = None,
    convolution_mode: Any = ConvolutionMode.CROSS_CORRELATION,
    compute_data_type: Any = None,
    name: str = "",
    *,
    pre_padding: IntOrInts = None,
    post_padding: IntOrInts = None,
) -> Tensor:
    """Y = conv(image, weight): a 1-D, 2-D or 3-D (grouped, dilated, strided) convolution.

    Shapes: image [N, C, *spatial], weight [K, C/groups, *filter] -> Y [N, K, *out] with
    `out_i = (in_i + pre_i + post_i - dilation_i * (filter_i - 1) - 1) // stride_i + 1`; groups is
    C / weight.dim[1] (depthwise: weight [C, 1, ...]).

    Layouts: any strides. Channels-last (NHWC: strides `[H*W*C, 1, W*C, C]`) is the fast layout of the
    generated and cuDNN kernels; Y takes the image's axis order unless its strides are set.

    Types: image and weight of one type (HALF, BFLOAT16, FLOAT, DOUBLE, FP8, INT8); products summed
    in `compute_data_type` (default the graph's, FLOAT); Y is the graph's intermediate type when
    virtual, its io type when an output (or what `set_data_type` says).

    Formula (CROSS_CORRELATION; CONVOLUTION flips the filter):
    `Y[n, k, p] = sum_{c, r} image[n, g*C/groups + c, p*stride + r*dilation - pre_padding] * weight[k, c, r]`
    with g = k // (K/groups) and zero outside the image.

    Args:
        image: the input feature map [N, C, *spatial].
        weight: the filter [K, C/groups, *filter].
        padding: zero padding on both sides of every spatial dim (an int means all of them).
        stride: output step in the input, per spatial dim (default 1).
        dilation: spacing of the filter taps (default 1).
        convolution_mode: ConvolutionMode.CROSS_CORRELATION (PyTorch's) or CONVOLUTION, or its name.
        compute_data_type: the type products are summed in.
        name: the op's name (shown in plans and errors).
        pre_padding: padding before each spatial dim (keyword; with post_padding, instead of padding).
        post_padding: padding after each spatial dim.

    Returns:
        Y, a virtual tensor (mark it with `.set_output(True)` to read it).

    Example:
        ```python
        x = g.tensor(dim=[8, 64, 56, 56], stride=[200704, 1, 3584, 64], name="X")   # NHWC
        w = g.tensor(dim=[128, 64, 3, 3], stride=[576, 1, 192, 64], name="W")
        y = g.conv_fprop(x, w, padding=1, stride=2)      # [8, 128, 28, 28]
        ```
    """
    attrs = _conv_attrs(
        "conv_fprop", name, [image, weight], padding, pre_padding, post_padding, stride, dilation, convolution_mode
    )
    return self._add_op(ConvFprop(**attrs), [image, weight], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def conv_dgrad(
    self,
    loss: Tensor,
    filter: Tensor,
    padding: IntOrInts = None,
    stride: IntOrInts = None,
    dilation: IntOrInts = None,
    convolution_mode: Any = ConvolutionMode.CROSS_CORRELATION,
    compute_data_type: Any = None,
    name: str = "",
    *,
    pre_padding: IntOrInts = None,
    post_padding: IntOrInts = None,
) -> Tensor:
    """DX, the gradient of `conv_fprop` with respect to its image (a transposed convolution).

    Shapes: loss DY [N, K, *out], filter [K, C/groups, *filter] -> DX [N, C, *in]. The input size is
    inferred as `(out_i - 1) * stride_i - pre_i - post_i + dilation_i * (filter_i - 1) + 1`, which a
    stride > 1 can leave ambiguous (and groups > 1 leaves C open): set DX's dims with `set_dim` then.

    Layouts: any strides; channels-last is the fast one. DX takes the loss's axis order.

    Types: loss and filter of one type; sums in `compute_data_type` (default FLOAT).

    Formula: `DX[n, c, q] = sum_{k, r} DY[n, k, p] * filter[k, c, r]` over the (p, r) with
    `q = p*stride + r*dilation - pre_padding`: what conv_fprop's Y[n, k, p] read of image[n, c, q].

    Args:
        loss: the gradient of conv_fprop's output, DY [N, K, *out].
        filter: conv_fprop's weight [K, C/groups, *filter].
        padding: conv_fprop's padding (the same arguments as the forward op).
        stride: conv_fprop's stride.
        dilation: conv_fprop's dilation.
        convolution_mode: conv_fprop's mode.
        compute_data_type: the type products are summed in.
        name: the op's name.
        pre_padding: conv_fprop's pre_padding.
        post_padding: conv_fprop's post_padding.

    Returns:
        DX, a virtual tensor.

    Example:
        ```python
        dy = g.tensor(dim=[8, 128, 28, 28], stride=[100352, 1, 3584, 128], name="dY")
        dx = g.conv_dgrad(dy, w, padding=1, stride=2).set_dim([8, 64, 56, 56]).set_output(True)
        ```
    """
    attrs = _conv_attrs(
        "conv_dgrad", name, [loss, filter], padding, pre_padding, post_padding, stride, dilation, convolution_mode
    )
    return self._add_op(ConvDgrad(**attrs), [loss, filter], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def conv_wgrad(
    self,
    image: Tensor,
    loss: Tensor,
    padding: IntOrInts = None,
    stride: IntOrInts = None,
    dilation: IntOrInts = None,
    convolution_mode: Any = ConvolutionMode.CROSS_CORRELATION,
    compute_data_type: Any = None,
    name: str = "",
    *,
    pre_padding: IntOrInts = None,
    post_padding: IntOrInts = None,
) -> Tensor:
    """DW, the gradient of `conv_fprop` with respect to its filter.

    Shapes: image [N, C, *in], loss DY [N, K, *out] -> DW [K, C/groups, *filter]. The filter size is
    inferred from in, out, padding, stride and dilation with groups = 1; set DW's dims for a grouped
    or depthwise convolution.

    Layouts: any strides; channels-last inputs are the fast ones. DW is packed in the image's axis order.

    Types: image and loss of one type; sums (over N and the output positions) in
    `compute_data_type` (default FLOAT).

    Formula: `DW[k, c, r] = sum_{n, p} DY[n, k, p] * image[n, c', p*stride + r*dilation - pre_padding]`
    with c' the input channel of group k // (K/groups).

    Args:
        image: conv_fprop's input [N, C, *in].
        loss: the gradient of conv_fprop's output, DY [N, K, *out].
        padding: conv_fprop's padding.
        stride: conv_fprop's stride.
        dilation: conv_fprop's dilation.
        convolution_mode: conv_fprop's mode.
        compute_data_type: the type products are summed in.
        name: the op's name.
        pre_padding: conv_fprop's pre_padding.
        post_padding: conv_fprop's post_padding.

    Returns:
        DW, a virtual tensor.

    Example:
        ```python
        dw = g.conv_wgrad(x, dy, padding=1, stride=2).set_output(True).set_name("dW")   # [128, 64, 3, 3]
        ```
    """
    attrs = _conv_attrs(
        "conv_wgrad", name, [image, loss], padding, pre_padding, post_padding, stride, dilation, convolution_mode
    )
    return self._add_op(ConvWgrad(**attrs), [image, loss], name=name, compute_data_type=compute_data_type)[0]
