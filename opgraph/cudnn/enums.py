"""cuDNN frontend's enums under their cuDNN names (`cudnn.data_type.HALF`, `cudnn.heur_mode.A`, ...).

Where opgraph has the concept, the member IS opgraph's value (`cudnn.data_type.HALF is
opgraph.DataType.HALF`), so a value passes straight into opgraph and compares equal to what opgraph
returns (`Y.get_data_type() == cudnn.data_type.HALF`). NOT_SET is None (opgraph's "not set"). cuDNN
names opgraph has no counterpart for (INT8x32 reordering, FFT and Winograd notes, FP4 ...) are
placeholders of their own: opgraph refuses them with a typed error when they are used.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

from ..core.config import BehaviorNote, HeurMode, NumericalNote
from ..core.dtypes import DataType
from ..ops.attention import DiagonalAlignment
from ..ops.conv import ConvolutionMode
from ..ops.norm_common import NormForwardPhase
from ..ops.pointwise import PointwiseMode
from ..ops.pooling import ResampleMode
from ..ops.reduction import ReductionMode


class _NamespaceMeta(type):
    __members__: dict[str, Any]  # set by _namespace

    def __iter__(cls) -> Iterator[Any]:
        return iter(v for v in cls.__members__.values() if v is not None)

    def __contains__(cls, value: Any) -> bool:
        return any(value is v or value == v for v in cls.__members__.values())

    def __repr__(cls) -> str:
        return f"<cudnn enum {cls.__name__}: {', '.join(cls.__members__)}>"


def _namespace(name: str, members: dict[str, Any]) -> Any:
    """A class whose attributes are the members (cuDNN's pybind enums are accessed the same way). Typed
    Any: the members are opgraph's own enum values (and placeholders), gathered here at import."""
    return _NamespaceMeta(name, (), {**members, "__members__": dict(members), "__slots__": ()})


class _Placeholder(enum.Enum):
    """Base of the placeholder enums (one per namespace, named after it)."""

    def __repr__(self) -> str:
        return f"cudnn.{type(self).__name__}.{self.name} (not supported by opgraph)"


def _placeholders(name: str, names: list[str]) -> dict[str, Any]:
    """cuDNN members opgraph does not implement: values of an enum of their own, so using one fails
    with opgraph's "unknown value" error naming it."""
    # the functional API: the enum is named after the namespace, which mypy cannot follow
    kind: Any = _Placeholder(name, {n: f"{name}.{n}" for n in names})  # type: ignore[call-arg]
    return {n: kind[n] for n in names}


data_type = _namespace(
    "data_type",
    {
        **{dt.name: dt for dt in DataType},
        "NOT_SET": None,
        **_placeholders(
            "data_type", ["INT8x4", "UINT8x4", "INT8x32", "FAST_FLOAT_FOR_FP8", "FP8_E8M0", "FP4_E2M1", "INT4"]
        ),
    },
)
heur_mode = _namespace("heur_mode", {m.name: m for m in HeurMode})
diagonal_alignment = _namespace("diagonal_alignment", {a.name: a for a in DiagonalAlignment})
norm_forward_phase = _namespace("norm_forward_phase", {**{p.name: p for p in NormForwardPhase}, "NOT_SET": None})
reduction_mode = _namespace("reduction_mode", {**{m.name: m for m in ReductionMode}, "NOT_SET": None})
convolution_mode = _namespace("convolution_mode", {m.name: m for m in ConvolutionMode})
pointwise_mode = _namespace("pointwise_mode", {m.name: m for m in PointwiseMode})
resample_mode = _namespace(
    "resample_mode",
    {
        "MAXPOOL": ResampleMode.MAX,
        "AVGPOOL_INCLUDE_PADDING": ResampleMode.AVG_INCLUDE_PADDING,
        "AVGPOOL_EXCLUDE_PADDING": ResampleMode.AVG_EXCLUDE_PADDING,
        **_placeholders("resample_mode", ["BILINEAR", "NEAREST"]),
    },
)
behavior_note = _namespace(
    "behavior_note",
    {
        **{n.name: n for n in BehaviorNote},
        **_placeholders("behavior_note", ["REQUIRES_FILTER_INT8x32_REORDER", "REQUIRES_BIAS_INT8x32_REORDER"]),
    },
)
numerical_note = _namespace(
    "numerical_note",
    {
        **{n.name: n for n in NumericalNote},
        **_placeholders(
            "numerical_note",
            ["FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP"],
        ),
    },
)


class build_plan_policy(enum.Enum):
    HEURISTICS_CHOICE = "heuristics_choice"  # build the candidates in order until one builds
    ALL = "all"  # build every candidate that builds


class knob_type(enum.Enum):
    """cuDNN's knob vocabulary. opgraph answers KERNEL_CFG only: which of an engine's ranked configs
    (its template knobs, tile sizes, split) a plan uses; `cudnn.pygraph.get_knobs_for_engine`."""

    NOT_SET = 0
    SWIZZLE = 1
    TILE_SIZE = 2
    EDGE = 3
    MULTIPLY = 4
    SPLIT_K_BUF = 5
    TILEK = 6
    STAGES = 7
    REDUCTION_MODE = 8
    SPLIT_K_SLC = 9
    IDX_MODE = 10
    SPECFILT = 11
    KERNEL_CFG = 12
    WORKSPACE = 13
    TILE_CGA_M = 14
    TILE_CGA_N = 15
    BLOCK_SIZE = 16
    OCCUPANCY = 17
    ARRAY_SIZE_PER_THREAD = 18
    SPLIT_COLS = 19
    TILE_ROWS = 20
    TILE_COLS = 21
    LOAD_SIZE = 22
    CTA_COUNT = 23
    STREAM_K = 24
    SPLIT_P_SLC = 25
    TILE_M = 26
    TILE_N = 27
    WARP_SPEC_CFG = 28


class tensor_reordering(enum.Enum):
    NONE = "none"
    INT8x32 = "int8x32"
    F16x16 = "f16x16"
    F8_128x4 = "f8_128x4"


class scalar_type(enum.Enum):
    RUNTIME_PARAM = "runtime_param"  # a pass-by-value tensor holding the value (no rebuild to change it)
    COMPILE_TIME_CONST = "compile_time_const"  # baked into the graph


class reshape_mode(enum.Enum):
    VIEW_ONLY = "view_only"
    LOGICAL = "logical"


class knob:
    """A knob of an engine: its type and the range of values (`min_value`..`max_value` by `stride`)."""

    __slots__ = ("max_value", "min_value", "stride", "type")

    def __init__(
        self, knob_type: knob_type = knob_type.NOT_SET, max_value: int = 0, min_value: int = 0, stride: int = 1
    ) -> None:
        self.type = knob_type
        self.max_value = int(max_value)
        self.min_value = int(min_value)
        self.stride = int(stride)

    def __repr__(self) -> str:
        return (
            f'{{"knob_type": "{self.type.name}", "max_value": {self.max_value}, '
            f'"min_value": {self.min_value}, "stride": {self.stride}}}'
        )


__all__ = [
    "behavior_note",
    "build_plan_policy",
    "convolution_mode",
    "data_type",
    "diagonal_alignment",
    "heur_mode",
    "knob",
    "knob_type",
    "norm_forward_phase",
    "numerical_note",
    "pointwise_mode",
    "reduction_mode",
    "resample_mode",
    "reshape_mode",
    "scalar_type",
    "tensor_reordering",
]
