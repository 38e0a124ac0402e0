"""memory.workspace: the layout of crossing tensors and scratch slots (aligned, disjoint), views into it,
and check() of a user's workspace (each refusal typed and naming its rule)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import CPU, Device
from opgraph.memory.workspace import ALIGN, align_up, check, plan_layout, scratch_view, tensor_views
from opgraph.testing import random_values
from opgraph.tools.samples import nhwc

from ..helpers import check_rule, torch_or_skip

DT = og.DataType
DIMS = [2, 3, 4, 5]


@pytest.fixture(scope="module")
def graph() -> og.FinalGraph:
    """x -> exp 'e' (HALF, channels-last, virtual) -> relu 'r' (virtual) -> +1 = y."""
    g = og.Graph("ws", io_data_type=DT.FLOAT)
    x = g.tensor(dim=DIMS, stride=nhwc(DIMS), name="x")
    t = g.exp(x, name="e").set_data_type(DT.HALF).set_stride(nhwc(DIMS))
    g.add(g.relu(t, name="r"), 1.0, name="a").set_output(True).set_name("y")
    g.validate()
    return g.final


def uids(f: og.FinalGraph) -> tuple[int, int, int, int]:
    """x, t (exp's output), u (relu's output), y."""
    return f.tensor("x").uid, f.nodes[0].outputs[0], f.nodes[1].outputs[0], f.tensor("y").uid


@pytest.mark.parametrize(
    "n,alignment",
    [(0, ALIGN), (1, ALIGN), (ALIGN - 1, ALIGN), (ALIGN, ALIGN), (ALIGN + 1, ALIGN), (17, 16), (32, 16), (5, 1)],
)
def test_align_up(n, alignment):
    got = align_up(n, alignment)
    assert got % alignment == 0 and n <= got < n + alignment


def test_layout_gives_each_crossing_tensor_an_aligned_slot_once_and_the_steps_one_scratch_region(graph):
    """Crossing tensors get disjoint aligned slots; the steps' scratch shares one region after them, as
    large as the largest step's (the steps run one after another)."""
    x, t, u, y = uids(graph)
    t_bytes = int(np.prod(DIMS)) * 2  # HALF
    u_bytes = int(np.prod(DIMS)) * 4
    # piece outputs: t (crossing), then t again with u, then y (a graph output: bound by the user)
    layout = plan_layout(graph, [[t], [t, u], [y]], [0, 100, 0, 700])
    assert dict(layout.tensors) == {t: (0, t_bytes), u: (align_up(t_bytes), u_bytes)}
    u_end = align_up(t_bytes) + align_up(u_bytes)
    assert dict(layout.scratch) == {1: (u_end, 100), 3: (u_end, 700)}
    assert layout.size == u_end + align_up(700)
    slots = sorted(layout.tensors.values()) + [(u_end, 700)]
    for (a, na), (b, _) in zip(slots, slots[1:]):
        assert a % ALIGN == 0 and a + na <= b  # aligned and disjoint
    assert slots[-1][0] + slots[-1][1] <= layout.size


def test_empty_layout(graph):
    layout = plan_layout(graph, [[uids(graph)[3]]], [0])
    assert dict(layout.tensors) == {} and dict(layout.scratch) == {} and layout.size == 0
    assert scratch_view(np.empty(1, np.uint8), layout, 0) is None


def _views_land_in_their_slots(graph, base, as_numpy):
    x, t, u, _ = uids(graph)
    layout = plan_layout(graph, [[t, u]], [64])
    views = tensor_views(base, layout, graph)
    assert set(views) == {t, u}
    raw = as_numpy(base)
    raw[...] = 0xAB
    rng = np.random.default_rng(0)
    for uid, view in views.items():
        desc = graph.tensors[uid]
        assert tuple(view.shape) == desc.dim
        arr = as_numpy(view)
        assert arr.dtype == desc.data_type.numpy
        assert tuple(s // arr.itemsize for s in arr.strides) == desc.stride
        offset, nbytes = layout.tensors[uid]
        values = random_values(desc, rng)
        arr[...] = values
        # the slot's bytes, read with the descriptor's strides, hold the values
        slot = raw[offset : offset + nbytes].view(desc.data_type.numpy)
        np.testing.assert_array_equal(
            np.lib.stride_tricks.as_strided(slot, desc.dim, [s * arr.itemsize for s in desc.stride]), values
        )
    scratch = scratch_view(base, layout, 0)
    lo, n = layout.scratch[0]
    assert as_numpy(scratch).shape == (n,)
    as_numpy(scratch)[...] = 7
    assert (raw[lo : lo + n] == 7).all()
    # nothing outside the slots was written
    used = np.zeros(layout.size, bool)
    for lo, n in [*layout.tensors.values(), *layout.scratch.values()]:
        used[lo : lo + n] = True
    assert (raw[: layout.size][~used] == 0xAB).all()


def test_views_on_a_numpy_workspace(graph):
    layout = plan_layout(graph, [[uids(graph)[1], uids(graph)[2]]], [64])
    _views_land_in_their_slots(graph, np.empty(layout.size, np.uint8), lambda a: a)


def test_views_on_a_torch_cpu_workspace(graph):
    torch = torch_or_skip()
    layout = plan_layout(graph, [[uids(graph)[1], uids(graph)[2]]], [64])
    _views_land_in_their_slots(graph, torch.empty(layout.size, dtype=torch.uint8), lambda t: t.numpy())


# -- check(): the user's workspace ------------------------------------------------------------------

SIZE = 1000


def test_a_good_workspace_is_returned_as_given(graph):
    ws = np.empty(SIZE + 13, np.uint8)
    assert check(ws, SIZE, CPU, graph, {}) is ws
    none = np.empty(0, np.uint8)
    assert check(none, 0, CPU, graph, {}) is none  # a plan that needs no workspace


def test_a_torch_cpu_workspace_is_accepted(graph):
    torch = torch_or_skip()
    ws = torch.empty(SIZE, dtype=torch.uint8)
    assert check(ws, SIZE, CPU, graph, {}) is ws


def _bad(ws, size=SIZE, device=CPU, bound=None, graph=None):
    with pytest.raises(og.VariantPackError) as err:
        check(ws, size, device, graph, bound or {})
    return err.value


@pytest.mark.parametrize("which", ["float32", "complex64", "2-D", "strided", "read-only", "a list", "None"])
def test_a_workspace_that_is_not_a_1d_uint8_array_is_refused(graph, which):
    ws = {
        "float32": np.empty(SIZE, np.float32),
        "complex64": np.empty(SIZE, np.complex64),  # a dtype opgraph does not know: still this rule
        "2-D": np.empty((1, SIZE), np.uint8),
        "strided": np.empty(2 * SIZE, np.uint8)[::2],
        "read-only": np.lib.stride_tricks.as_strided(np.empty(SIZE, np.uint8), writeable=False),
        "a list": [0] * SIZE,
        "None": None,
    }[which]
    err = check_rule(_bad(ws, graph=graph), "pack.workspace")
    assert "a contiguous 1-D uint8 NumPy array" in str(err) and "plan.workspace_size" in str(err)


def test_a_workspace_on_another_device_is_refused(graph):
    err = check_rule(_bad(np.empty(SIZE, np.uint8), device=Device("cuda"), graph=graph), "pack.workspace")
    assert "a 1-D uint8 torch tensor on cuda:0" in str(err)
    torch = torch_or_skip()
    check_rule(_bad(torch.empty(SIZE, dtype=torch.uint8, device="meta"), graph=graph), "pack.workspace")


def test_a_small_workspace_says_how_big_it_must_be(graph):
    err = check_rule(_bad(np.empty(SIZE - 1, np.uint8), graph=graph), "pack.workspace_size")
    assert f"{SIZE - 1} bytes but the plan needs {SIZE}" in str(err)


@pytest.mark.parametrize("where", ["inside", "straddles the start", "straddles the end"])
def test_a_workspace_overlapping_a_bound_buffer_names_the_tensor(graph, where):
    x, _, _, y = uids(graph)
    block = np.empty(3 * SIZE, np.uint8)
    ws = block[SIZE : 2 * SIZE]
    start = {"inside": SIZE + 100, "straddles the start": SIZE - 8, "straddles the end": 2 * SIZE - 8}[where]
    buf = block[start : start + 64].view(np.float32)
    err = check_rule(
        _bad(ws, bound={x: np.empty(4, np.float32), y: buf, 7: 1.5}, graph=graph), "pack.workspace_overlap", "y"
    )
    assert f"(uid {y})" in str(err)


def test_only_the_bytes_the_plan_uses_must_be_free(graph):
    x, _, _, y = uids(graph)
    block = np.empty(3 * SIZE, np.uint8)
    ws = block[SIZE:]  # 2*SIZE bytes; the plan uses the first SIZE
    before = block[SIZE - 64 : SIZE].view(np.float32)  # ends where the workspace starts
    after = block[2 * SIZE : 2 * SIZE + 64].view(np.float32)  # in the workspace's unused tail
    assert check(ws, SIZE, CPU, graph, {x: before, y: after, 3: 2.0, 4: True}) is ws
