"""Data types: the `DataType` enum and conversions to and from NumPy, ml_dtypes and PyTorch.

PyTorch is never imported here at module load; a torch dtype is recognised by its type's module.
"""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np

from .errors import DataTypeError


class DataType(enum.Enum):
    FLOAT = "float"
    DOUBLE = "double"
    HALF = "half"
    BFLOAT16 = "bfloat16"
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    INT64 = "int64"
    BOOLEAN = "boolean"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"

    def __repr__(self) -> str:
        return f"DataType.{self.name}"

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds this type (ml_dtypes for bfloat16 and fp8)."""
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_floating(self) -> bool:
        return self in _FLOATING

    @property
    def is_integer(self) -> bool:
        return self in (DataType.INT8, DataType.UINT8, DataType.INT32, DataType.INT64)

    @property
    def short(self) -> str:
        """Compact name used in printouts: f32, f16, bf16, i8, ..."""
        return _SHORT[self]

    def to_torch(self) -> Any:
        """The PyTorch dtype (imports torch)."""
        import torch

        return getattr(torch, _TORCH_NAMES[self])


_TO_NUMPY = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.HALF: np.dtype(np.float16),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.BOOLEAN: np.dtype(np.bool_),
    DataType.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
_FLOATING = {
    DataType.FLOAT,
    DataType.DOUBLE,
    DataType.HALF,
    DataType.BFLOAT16,
    DataType.FP8_E4M3,
    DataType.FP8_E5M2,
}
_SHORT = {
    DataType.FLOAT: "f32",
    DataType.DOUBLE: "f64",
    DataType.HALF: "f16",
    DataType.BFLOAT16: "bf16",
    DataType.INT8: "i8",
    DataType.UINT8: "u8",
    DataType.INT32: "i32",
    DataType.INT64: "i64",
    DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "f8e4m3",
    DataType.FP8_E5M2: "f8e5m2",
}
_TORCH_NAMES = {
    DataType.FLOAT: "float32",
    DataType.DOUBLE: "float64",
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.INT8: "int8",
    DataType.UINT8: "uint8",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "float8_e4m3fn",
    DataType.FP8_E5M2: "float8_e5m2",
}
_FROM_TORCH_NAME = {v: k for k, v in _TORCH_NAMES.items()}
_ALIASES = {
    "float32": DataType.FLOAT,
    "fp32": DataType.FLOAT,
    "f32": DataType.FLOAT,
    "float64": DataType.DOUBLE,
    "fp64": DataType.DOUBLE,
    "f64": DataType.DOUBLE,
    "float16": DataType.HALF,
    "fp16": DataType.HALF,
    "f16": DataType.HALF,
    "bf16": DataType.BFLOAT16,
    "bool": DataType.BOOLEAN,
    "float8_e4m3fn": DataType.FP8_E4M3,
    "float8_e5m2": DataType.FP8_E5M2,
}


def as_data_type(value: Any, *, what: str = "data_type") -> DataType:
    """Turn a DataType, its name, a NumPy/ml_dtypes dtype or a PyTorch dtype into a DataType."""
    if isinstance(value, DataType):
        return value
    if isinstance(value, str):
        key = value.strip()
        if key.upper() in DataType.__members__:
            return DataType[key.upper()]
        low = key.lower()
        for dt in DataType:
            if dt.value == low:
                return dt
        if low in _ALIASES:
            return _ALIASES[low]
    elif value is None:
        pass  # np.dtype(None) would say float64
    elif type(value).__module__ == "torch":  # a torch.dtype, without importing torch
        name = str(value).removeprefix("torch.")
        if name in _FROM_TORCH_NAME:
            return _FROM_TORCH_NAME[name]
    else:
        try:
            np_dtype = np.dtype(value)
        except TypeError:
            np_dtype = None
        if np_dtype is not None and np_dtype in _FROM_NUMPY:
            return _FROM_NUMPY[np_dtype]
    supported = ", ".join(dt.name for dt in DataType)
    raise DataTypeError(
        f"{what}={value!r} is not a data type opgraph knows",
        rule="dtype.unknown",
        hint=f"pass an opgraph.DataType ({supported}), a NumPy dtype or a PyTorch dtype",
    )


def from_numpy_dtype(dtype: np.dtype) -> DataType:
    return as_data_type(dtype)
