"""The address table of by-reference tensors: one int64 slot per tensor, in device memory (host
memory on the CPU), read by generated kernels at run time.

Writing a slot (`AddressTable.write`, or any device-side copy into `plan.address_table`) redirects
every later launch that reads it, including launches replayed from a captured CUDA graph, without
an update call. Writes from the host are ordered on the current stream (a pinned, asynchronous copy),
so kernels enqueued before the write still see the old address.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import VariantPackError
from ..core.ir import FinalGraph
from .buffers import address_of

TABLE_KEY = -1  # the table's entry in a plan's buffer map (UIDs are >= 0)


def table_slots(graph: FinalGraph) -> dict[int, tuple[int, DataType]]:
    """{uid: (slot, data type)} of the graph's by-reference tensors, in UID order."""
    uids = sorted(u for u, t in graph.tensors.items() if t.is_by_reference and not t.is_virtual)
    return {u: (i, graph.tensors[u].data_type) for i, u in enumerate(uids)}


class AddressTable:
    def __init__(self, graph: FinalGraph, device: Device) -> None:
        self.graph = graph
        self.device = device
        self.slots = table_slots(graph)
        self.current: list[int] = [0] * len(self.slots)
        self.tensor: Any = None
        self._ring: list[tuple[Any, Any]] = []
        self._next = 0
        self.exposed = False  # the device tensor was handed to the user (plan.address_table)
        if self.slots:
            import torch

            where = device.torch_name
            self.tensor = torch.zeros(len(self.slots), dtype=torch.int64, device=where)

    def __bool__(self) -> bool:
        return bool(self.slots)

    def addresses(self, buffers: dict[int, Any]) -> list[int]:
        out = list(self.current)
        for uid, (slot, _) in self.slots.items():
            out[slot] = address_of(buffers[uid])
        return out

    def write(self, addresses: list[int], force: bool = False) -> None:
        """Point the table at `addresses` (ordered on the current stream). Skipped when they equal the
        host mirror, unless forced or the table was handed out (`exposed`): device-side writes into it
        are invisible to the mirror, so from then on every write goes through."""
        if addresses == self.current and not force and not self.exposed:
            return
        for uid, (slot, _) in self.slots.items():
            if addresses[slot] % 16:
                raise VariantPackError(
                    f"the buffer's address {addresses[slot]:#x} is not 16-byte aligned",
                    tensor=self.graph.tensors[uid],
                    rule="pack.alignment",
                    hint="by-reference buffers must start on a 16-byte boundary (fresh allocations do)",
                )
        if self.device.is_cuda:
            self._write_async(addresses)
        else:
            import torch

            self.tensor.copy_(torch.tensor(addresses, dtype=torch.int64))
        self.current = list(addresses)

    def _write_async(self, addresses: list[int]) -> None:
        """An asynchronous copy from one of a few pinned host buffers, reused once the copy that last
        read it has completed (an event per buffer), so the host never waits in the common case."""
        import torch

        if not self._ring:
            self._ring = [
                (torch.empty(len(addresses), dtype=torch.int64).pin_memory(), torch.cuda.Event()) for _ in range(4)
            ]
        host, done = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        done.synchronize()
        host.copy_(torch.tensor(addresses, dtype=torch.int64))
        self.tensor.copy_(host, non_blocking=True)
        done.record()

    def update_from(self, pointers: Mapping[int, int], force: bool = False) -> None:
        """Point the table at the by-reference tensors' addresses in `pointers` (uid -> address)."""
        if self.slots:
            addresses = list(self.current)
            for uid, (slot, _) in self.slots.items():
                addresses[slot] = pointers[uid]
            self.write(addresses, force=force)

    def update(self, buffers: dict[int, Any]) -> None:
        if self.slots:
            self.write(self.addresses(buffers))
            buffers[TABLE_KEY] = self.tensor
