"""Names for the values opgraph takes from users without owning their type, so that signatures say
what they mean. They are aliases (a reader's and a type checker's vocabulary), not classes: nothing
is converted or checked by them; `memory.buffers` and `runtime.bindings` do the checking.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

Buffer: TypeAlias = Any
"""Memory a tensor is bound to: a NumPy array, a torch.Tensor, an object with `__dlpack__` or
`__cuda_array_interface__`, a device pointer (int) where the API takes one, or a Python number for a
pass-by-value tensor. `memory.buffers.buffer_info` turns any of them into a `BufferInfo`."""

Stream: TypeAlias = Any
"""A CUDA stream: a torch.cuda.Stream, a raw cudaStream_t (int, e.g. `torch.cuda.current_stream().cuda_stream`)
or None for the current stream."""

PackKey: TypeAlias = Any
"""A variant pack key: a Tensor handle, a TensorDesc, a UID (int) or a tensor name (str)."""

VariantPack: TypeAlias = Mapping[PackKey, Buffer]
"""The buffers a plan runs on, by tensor (`runtime.bindings` checks every entry before anything runs)."""

UidPack: TypeAlias = dict[int, Buffer]
"""A variant pack keyed by UID that opgraph builds and keeps (training steps, the importer's runtime)."""

__all__ = ["Buffer", "PackKey", "Stream", "UidPack", "VariantPack"]
