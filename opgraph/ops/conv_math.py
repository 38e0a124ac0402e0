"""What a convolution computes: its mode, its geometry (output sizes, padding, the spans of taps) and
the NumPy float64 reference of the forward, data-gradient and weight-gradient convolutions that the
ops in opgraph.ops.conv use as their semantics (the formulas are in that module's docstring)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..core.dtypes import DataType


class ConvolutionMode(enum.Enum):
    CROSS_CORRELATION = "cross_correlation"
    CONVOLUTION = "convolution"  # the filter is flipped in every spatial axis

    def __repr__(self) -> str:
        return f"ConvolutionMode.{self.name}"


INPUT_TYPES = frozenset(
    {
        DataType.FLOAT,
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.DOUBLE,
        DataType.FP8_E4M3,
        DataType.FP8_E5M2,
        DataType.INT8,
        DataType.UINT8,
    }
)
_OUT_LETTERS = "xyz"  # einsum letters of the output (loss) spatial axes
_TAP_LETTERS = "rst"  # ... and of the filter taps


@dataclass(frozen=True)
class ConvGeometry:
    """Padding, stride and dilation resolved to one value per spatial axis."""

    pre: tuple[int, ...]
    post: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]

    def out_size(self, x: Sequence[int], r: Sequence[int]) -> tuple[int, ...]:
        """Forward output spatial dims from image dims x and filter taps r."""
        return tuple(
            (xi + p0 + p1 - ((ri - 1) * d + 1)) // s + 1
            for xi, ri, p0, p1, s, d in zip(x, r, self.pre, self.post, self.stride, self.dilation)
        )

    def image_sizes(self, y: Sequence[int], r: Sequence[int]) -> list[tuple[int, int]]:
        """Per axis, the (lo, hi) range of image sizes the forward formula maps to y (lo > hi: none).
        A stride s leaves s candidates, minus those below 1."""
        spans = []
        for yi, ri, p0, p1, s, d in zip(y, r, self.pre, self.post, self.stride, self.dilation):
            lo = (yi - 1) * s + (ri - 1) * d + 1 - p0 - p1
            spans.append((max(lo, 1), lo + s - 1))
        return spans

    def filter_sizes(self, x: Sequence[int], y: Sequence[int]) -> list[tuple[int, int]]:
        """Per axis, the (lo, hi) range of filter sizes the forward formula maps from x to y."""
        spans = []
        for xi, yi, p0, p1, s, d in zip(x, y, self.pre, self.post, self.stride, self.dilation):
            hi_eff = xi + p0 + p1 - (yi - 1) * s  # the dilated filter extent (r-1)*d + 1 lies in
            lo_eff = max(hi_eff - s + 1, 1)  # [hi_eff - s + 1, hi_eff]
            spans.append((-(-(lo_eff - 1) // d) + 1, (hi_eff - 1) // d + 1))
        return spans

    def describe(self) -> str:
        return (
            f"pre_padding {list(self.pre)}, post_padding {list(self.post)}, stride {list(self.stride)}, "
            f"dilation {list(self.dilation)}"
        )


def pick_sizes(spans: list[tuple[int, int]]) -> tuple[int, ...] | None:
    """The unique size per axis, or None when some axis has several."""
    return tuple(lo for lo, _ in spans) if all(lo == hi for lo, hi in spans) else None


def spans_text(spans: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in spans) + "]"


# -- the reference math ------------------------------------------------------------------------------


def _flip_taps(w: np.ndarray) -> np.ndarray:
    return np.flip(w, axis=tuple(range(2, w.ndim)))


def _pad_grouped(x: np.ndarray, groups: int, geo: ConvGeometry) -> np.ndarray:
    """X^ as [N, G, C/G, padded spatial...]."""
    xp = np.pad(x, [(0, 0), (0, 0), *zip(geo.pre, geo.post)])
    n, c = x.shape[:2]
    return xp.reshape(n, groups, c // groups, *xp.shape[2:])


def _windows(xp: np.ndarray, taps: Sequence[int], out: Sequence[int], geo: ConvGeometry) -> np.ndarray:
    """A read-only view V[..., o..., r...] = xp[..., o*s + r*d] over the trailing spatial axes of xp."""
    nsp = len(taps)
    extent = [(r - 1) * d + 1 for r, d in zip(taps, geo.dilation)]
    win = sliding_window_view(xp, extent, axis=tuple(range(xp.ndim - nsp, xp.ndim)))
    lead = (slice(None),) * (xp.ndim - nsp)
    at_out = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, geo.stride))
    at_tap = tuple(slice(None, None, d) for d in geo.dilation)
    return win[lead + at_out + at_tap]


def conv_forward(x: np.ndarray, w: np.ndarray, geo: ConvGeometry, mode: ConvolutionMode) -> np.ndarray:
    """Y = conv_fprop(X, W) in float64 (see ConvFprop)."""
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    groups, taps = c // cg, w.shape[2:]
    out = geo.out_size(x.shape[2:], taps)
    if mode is ConvolutionMode.CONVOLUTION:
        w = _flip_taps(w)
    win = _windows(_pad_grouped(x, groups, geo), taps, out, geo)
    wg = w.reshape(groups, k // groups, cg, *taps)
    o, r = _OUT_LETTERS[: len(taps)], _TAP_LETTERS[: len(taps)]
    y = np.einsum(f"ngc{o}{r},gkc{r}->ngk{o}", win, wg, optimize=True)
    return y.reshape(n, k, *out)


def conv_data_grad(
    dy: np.ndarray, w: np.ndarray, x_dim: Sequence[int], geo: ConvGeometry, mode: ConvolutionMode
) -> np.ndarray:
    """DX of image dims x_dim from DY and W in float64 (see ConvDgrad)."""
    n, k = dy.shape[:2]
    c, cg = x_dim[1], w.shape[1]
    groups, taps, out = c // cg, w.shape[2:], dy.shape[2:]
    if mode is ConvolutionMode.CONVOLUTION:
        w = _flip_taps(w)
    wg = w.reshape(groups, k // groups, cg, *taps)
    dyg = dy.reshape(n, groups, k // groups, *out)
    padded = [xi + p0 + p1 for xi, p0, p1 in zip(x_dim[2:], geo.pre, geo.post)]
    dxp = np.zeros((n, groups, cg, *padded))
    o = _OUT_LETTERS[: len(taps)]
    lead = (slice(None),) * 3
    # Each filter tap scatters DY (times that tap's weights) onto a strided, non-overlapping slice.
    for tap in np.ndindex(*taps):
        target = tuple(
            slice(t * d, t * d + (yo - 1) * s + 1, s) for t, d, yo, s in zip(tap, geo.dilation, out, geo.stride)
        )
        w_tap = (Ellipsis, *tap)
        dxp[lead + target] += np.einsum(f"ngk{o},gkc->ngc{o}", dyg, wg[w_tap], optimize=True)
    crop = tuple(slice(p0, p0 + xi) for p0, xi in zip(geo.pre, x_dim[2:]))
    return dxp[lead + crop].reshape(n, c, *x_dim[2:])


def conv_weight_grad(
    x: np.ndarray, dy: np.ndarray, w_dim: Sequence[int], geo: ConvGeometry, mode: ConvolutionMode
) -> np.ndarray:
    """DW of filter dims w_dim from X and DY in float64 (see ConvWgrad)."""
    n, c = x.shape[:2]
    k, cg, taps = dy.shape[1], w_dim[1], tuple(w_dim[2:])
    groups, out = c // cg, dy.shape[2:]
    win = _windows(_pad_grouped(x, groups, geo), taps, out, geo)
    dyg = dy.reshape(n, groups, k // groups, *out)
    o, r = _OUT_LETTERS[: len(taps)], _TAP_LETTERS[: len(taps)]
    dw = np.einsum(f"ngk{o},ngc{o}{r}->gkc{r}", dyg, win, optimize=True).reshape(k, cg, *taps)
    return _flip_taps(dw) if mode is ConvolutionMode.CONVOLUTION else dw
