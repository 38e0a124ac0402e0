"""The tensors of `cudnn.pygraph`: opgraph's handles with cuDNN's ragged offsets (`Tensor_`), and the
read-only view `query_tensor_attributes_of_uid` returns (`tensor_attributes`)."""

from __future__ import annotations

from typing import Any

from ..core.dtypes import DataType
from ..core.tensor import Tensor, TensorDesc


class Tensor_(Tensor):  # noqa: N801
    """The tensors of a cudnn.pygraph: opgraph's handles plus cuDNN's ragged offset."""

    __slots__ = ()

    def set_ragged_offset(self, ragged_offset: Tensor) -> Tensor_:
        graph: Any = self._graph
        graph._ragged_offsets[id(self)] = ragged_offset
        graph._invalidate()
        return self

    def get_ragged_offset(self) -> Tensor | None:
        graph: Any = self._graph
        return graph._ragged_offsets.get(id(self))


def adopt(t: Any) -> Any:
    """Give a handle of a pygraph cuDNN's tensor methods (same layout: the class is swapped)."""
    if type(t) is Tensor:
        t.__class__ = Tensor_
    return t


class tensor_attributes:
    """A read-only view of a tensor of a built graph."""

    def __init__(self, desc: TensorDesc) -> None:
        self._desc = desc

    def get_uid(self) -> int:
        return self._desc.uid

    def get_name(self) -> str:
        return self._desc.name

    def get_dim(self) -> list[int]:
        return list(self._desc.dim)

    def get_stride(self) -> list[int]:
        return list(self._desc.stride)

    def get_data_type(self) -> DataType:
        return self._desc.data_type

    def get_is_virtual(self) -> bool:
        return self._desc.is_virtual

    def get_is_pass_by_value(self) -> bool:
        return self._desc.is_pass_by_value

    def __repr__(self) -> str:
        return str(self._desc)


__all__ = ["Tensor_", "adopt", "tensor_attributes"]
