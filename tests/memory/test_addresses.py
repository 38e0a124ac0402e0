"""memory.addresses: one table slot per bound by-reference tensor (in UID order), and the table's writes
on the CPU (addresses of the bound buffers, alignment refused before anything is written, the
skip-when-unchanged mirror and its exceptions)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import CPU
from opgraph.memory.addresses import TABLE_KEY, AddressTable, table_slots

from ..helpers import check_rule, torch_or_skip

DT = og.DataType


@pytest.fixture(scope="module")
def graph() -> og.FinalGraph:
    """x (uid 7, by reference) + b (uid 5, HALF, bound as usual) -> virtual by-reference t -> relu = y
    (uid 3, by reference)."""
    g = og.Graph("refs", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 8], name="x", uid=7, is_by_reference=True)
    b = g.tensor(dim=[1, 8], name="b", uid=5, data_type=DT.HALF)
    t = g.add(x, b, name="add").set_is_by_reference(True)  # virtual: never bound, so no slot
    g.relu(t, name="relu").set_output(True).set_name("y").set_uid(3).set_is_by_reference(True)
    g.validate()
    return g.final


def buffers(graph) -> dict[int, np.ndarray]:
    return {u: np.empty(graph.tensors[u].dim, graph.tensors[u].data_type.numpy) for u in (3, 5, 7)}


def test_slots_are_the_bound_by_reference_tensors_in_uid_order(graph):
    assert table_slots(graph) == {3: (0, DT.FLOAT), 7: (1, DT.FLOAT)}


def test_a_graph_without_by_reference_tensors_has_an_empty_table():
    g = og.Graph("plain", io_data_type=DT.FLOAT)
    g.relu(g.tensor(dim=[4], name="x")).set_output(True)
    g.validate()
    assert table_slots(g.final) == {}
    table = AddressTable(g.final, CPU)
    assert not table and table.tensor is None
    bufs = {1: np.empty(4, np.float32)}
    table.update(bufs)
    assert TABLE_KEY not in bufs


def test_update_writes_each_buffers_address_into_its_slot(graph):
    torch = torch_or_skip()
    table = AddressTable(graph, CPU)
    assert table and table.tensor.dtype == torch.int64 and table.tensor.tolist() == [0, 0]
    bufs = buffers(graph)
    table.update(bufs)
    want = [bufs[3].ctypes.data, bufs[7].ctypes.data]
    assert table.tensor.tolist() == want and table.current == want
    assert bufs[TABLE_KEY] is table.tensor
    # new buffers: new addresses; torch tensors count by data_ptr()
    y = torch.empty(4, 8)
    table.update({**bufs, 3: y})
    assert table.tensor.tolist() == [y.data_ptr(), bufs[7].ctypes.data]


def test_a_misaligned_buffer_is_refused_before_the_table_changes(graph):
    torch_or_skip()
    table = AddressTable(graph, CPU)
    bufs = buffers(graph)
    table.update(bufs)
    before = table.tensor.tolist()
    raw = np.empty(4 * 8 * 4 + 16, np.uint8)
    start = next(i for i in range(16) if (raw.ctypes.data + i) % 16 == 4)
    bufs[7] = raw[start : start + 128].view(np.float32).reshape(4, 8)
    with pytest.raises(og.VariantPackError) as err:
        table.update(bufs)
    check_rule(err.value, "pack.alignment", "x")
    assert "not 16-byte aligned" in str(err.value)
    assert table.tensor.tolist() == before and table.current == before


def test_write_skips_unchanged_addresses_unless_forced_or_exposed(graph):
    torch_or_skip()
    table = AddressTable(graph, CPU)
    addresses = table.addresses(buffers(graph))
    table.write(addresses)
    table.tensor[0] = 4096  # what a device-side copy into plan.address_table does: the mirror cannot see it
    table.write(addresses)
    assert table.tensor[0].item() == 4096  # skipped: equal to the mirror
    table.write(addresses, force=True)
    assert table.tensor.tolist() == addresses
    table.tensor[0] = 4096
    table.exposed = True
    table.write(addresses)
    assert table.tensor.tolist() == addresses
