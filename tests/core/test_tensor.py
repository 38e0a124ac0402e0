"""Tensors: g.tensor arguments, tensor_like (NumPy, PyTorch, DLPack), setters, inferred properties,
bad dims/strides/UIDs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, poison

D = og.DataType


def test_tensor_arguments_read_back():
    g = og.Graph(io_data_type=D.FLOAT)
    t = g.tensor([2, 3, 4], [1, 8, 2], D.HALF, "t", 42, False, False)
    assert (t.dim, t.stride, t.data_type, t.name, t.uid) == ((2, 3, 4), (1, 8, 2), D.HALF, "t", 42)
    assert not t.is_virtual and not t.is_pass_by_value and t.is_output
    assert (t.get_dim(), t.get_stride(), t.get_data_type(), t.get_name(), t.get_uid()) == (
        [2, 3, 4],
        [1, 8, 2],
        D.HALF,
        "t",
        42,
    )
    v = g.tensor(dim=[1], is_virtual=True, is_pass_by_value=True)
    assert v.is_virtual and v.is_pass_by_value and not v.is_output
    assert v.uid is None and v.stride is None and v.data_type is None  # nothing assigned before validate
    assert t.graph is g
    assert "'t'" in repr(t) and "uid 42" in repr(t)


def test_defaults_after_validate():
    g = og.Graph(io_data_type=D.HALF, intermediate_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 3, 4, 5], name="x")  # no stride, no type
    h = g.exp(x)  # virtual
    y = g.relu(h).set_output(True)
    assert x.stride is None and h.dim is None and y.uid is None
    g.validate()
    assert x.stride == (60, 20, 5, 1)  # packed row-major
    assert x.data_type is D.HALF  # io type for non-virtual
    assert h.data_type is D.FLOAT and h.dim == (2, 3, 4, 5) and h.stride == (60, 20, 5, 1)
    assert y.data_type is D.HALF and y.dim == (2, 3, 4, 5)
    uids = [x.uid, h.uid, y.uid]
    assert all(isinstance(u, int) for u in uids) and len(set(uids)) == 3
    assert g.final.tensors[h.uid].is_virtual and not g.final.tensors[y.uid].is_virtual


def test_assigned_uids_avoid_user_uids_and_repeat_across_graphs():
    for _ in range(2):  # two graphs with the same UIDs
        g = og.Graph()
        a = g.tensor(dim=[4], name="a", uid=1)
        b = g.tensor(dim=[4], name="b")
        c = g.tensor(dim=[4], name="c", uid=3)
        ab = g.add(a, b)
        s = g.add(ab, c).set_output(True)
        g.validate()
        assert a.uid == 1 and c.uid == 3
        uids = [a.uid, b.uid, c.uid, ab.uid, s.uid]
        assert len(set(uids)) == 5 and set(g.final.tensors) == set(uids)


def test_setters_chain_and_invalidate():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 3], name="x")
    y = g.relu(x)
    assert y.set_output(True) is y
    assert y.set_name("y").set_data_type(D.HALF).set_uid(77).set_dim([2, 3]).set_stride([1, 2]) is y
    assert x.set_is_virtual(False).set_is_pass_by_value(False) is x
    final = g.validate().final
    assert final.tensors[77].name == "y" and final.tensors[77].data_type is D.HALF
    assert final.tensors[77].stride == (1, 2)
    assert "validated" in repr(g)
    y.set_name("renamed")  # any setter drops the validated graph
    assert "validated" not in repr(g)
    assert g.final is not final and g.final.tensors[77].name == "renamed"
    y.set_uid(78)
    assert 78 in g.final.tensors and 77 not in g.final.tensors
    y.set_output(False)  # back to virtual: nobody reads it now
    with pytest.raises(og.DataflowError, match="never read"):
        g.validate()
    y.set_output(True)
    g.validate()


def test_inferred_properties_do_not_override_user_values():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 3, 4, 5], stride=[60, 1, 15, 3], name="x")  # NHWC
    y = g.sigmoid(x).set_output(True)
    g.validate()
    assert y.stride == (60, 1, 15, 3)  # follows the input's layout
    assert x.uid is not None
    y.set_data_type(D.BFLOAT16)
    assert y.data_type is D.BFLOAT16  # the user's value, before and after validate
    g.validate()
    assert y.data_type is D.BFLOAT16


# -- tensor_like ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, dims, strides, dt",
    [
        (lambda: np.zeros((2, 3, 4, 5), np.float32), (2, 3, 4, 5), (60, 20, 5, 1), D.FLOAT),
        (lambda: np.zeros((2, 4, 5, 3), np.float16).transpose(0, 3, 1, 2), (2, 3, 4, 5), (60, 1, 15, 3), D.HALF),
        (lambda: np.zeros((4, 6), np.int8)[:, ::2], (4, 3), (6, 2), D.INT8),
        (lambda: np.zeros((3, 4), np.float64).T, (4, 3), (1, 4), D.DOUBLE),
        (lambda: np.zeros((5,), ml_dtypes.bfloat16), (5,), (1,), D.BFLOAT16),
        (lambda: np.zeros((2, 2), ml_dtypes.float8_e4m3fn), (2, 2), (2, 1), D.FP8_E4M3),
        (lambda: np.zeros((2, 1, 3), np.bool_), (2, 1, 3), (3, 3, 1), D.BOOLEAN),
        (lambda: np.zeros((), np.float32), (1,), (1,), D.FLOAT),
    ],
    ids=["nchw", "nhwc-view", "strided", "transposed", "bf16", "fp8", "bool", "0d"],
)
def test_tensor_like_numpy(make, dims, strides, dt):
    g = og.Graph()
    t = g.tensor_like(make(), name="t", uid=9)
    assert (t.dim, t.stride, t.data_type, t.name, t.uid) == (dims, strides, dt, "t", 9)
    assert not t.is_virtual and not t.is_pass_by_value


def test_tensor_like_python_number_is_pass_by_value():
    g = og.Graph(compute_data_type=D.FLOAT)
    s = g.tensor_like(0.5, name="s")
    assert s.is_pass_by_value and s.dim == (1,) and s.data_type is D.FLOAT


def test_tensor_like_rejects_what_it_cannot_describe():
    g = og.Graph()
    with pytest.raises(og.ShapeError) as ei:
        g.tensor_like(np.zeros((3, 4), np.float32)[::-1])  # negative strides
    assert "[rule tensor.stride]" in str(ei.value)
    with pytest.raises(og.DataTypeError):
        g.tensor_like(np.zeros(3, np.complex64))
    with pytest.raises(og.VariantPackError):
        g.tensor_like("not a buffer")
    with pytest.raises(og.ShapeError):
        g.tensor_like(np.zeros((2, 0), np.float32))  # zero-sized
    assert g._tensors == []  # nothing half-declared


def test_tensor_like_torch():
    torch = pytest.importorskip("torch")
    g = og.Graph()
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    t = g.tensor_like(cl)
    assert t.dim == (2, 3, 4, 5) and t.stride == (60, 1, 15, 3) and t.data_type is D.FLOAT
    t = g.tensor_like(torch.zeros(4, 6, dtype=torch.bfloat16)[:, 1::2])
    assert t.dim == (4, 3) and t.stride == (6, 2) and t.data_type is D.BFLOAT16
    t = g.tensor_like(torch.zeros(3, dtype=torch.float8_e5m2, requires_grad=False))
    assert t.data_type is D.FP8_E5M2
    t = g.tensor_like(torch.zeros(2, 3, dtype=torch.float16, requires_grad=True))
    assert t.dim == (2, 3) and t.data_type is D.HALF


class DLPackOnly:
    """Any object with the DLPack protocol and nothing else."""

    def __init__(self, array):
        self._a = array

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_tensor_like_dlpack():
    g = og.Graph()
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4).transpose(0, 2, 1)
    t = g.tensor_like(DLPackOnly(a))
    assert t.dim == (2, 4, 3) and t.stride == (12, 1, 4) and t.data_type is D.INT32


def test_tensor_like_layouts_execute(rng):
    """Tensors described by tensor_like take those very buffers in the variant pack."""
    torch = pytest.importorskip("torch")
    x_t = torch.from_numpy(rng.uniform(-2, 2, (2, 3, 4, 5)).astype(np.float32)).to(memory_format=torch.channels_last)
    b_np = rng.uniform(-2, 2, (1, 3, 1, 1)).astype(np.float32)
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor_like(x_t, name="x")
    b = g.tensor_like(DLPackOnly(b_np), name="b")
    y = g.add(x, b).set_output(True).set_name("y")
    g.validate()
    assert y.stride == (60, 1, 15, 3)
    out = poison(torch.empty_like(x_t).numpy())  # channels_last too
    out_t = torch.from_numpy(out)
    g.build(device="cpu").execute({x: x_t, b: b_np, y: out_t})
    want = (x_t.double() + torch.from_numpy(b_np).double()).numpy()
    assert compare(g.final.tensors[y.uid], out, want) is None


# -- bad values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [[0, 2], [-1, 2], [1.5, 2], 5, [True, 2], ["2"], [2**63]], ids=lambda v: repr(v))
def test_bad_dims(dim):
    g = og.Graph()
    with pytest.raises(og.ShapeError) as ei:
        g.tensor(dim=dim, name="bad")
    assert "[rule tensor.dim]" in str(ei.value) and "'bad'" in str(ei.value)
    t = g.tensor(dim=[2], name="ok")
    with pytest.raises(og.ShapeError):
        t.set_dim(dim)
    assert t.dim == (2,)  # unchanged by the failed setter


@pytest.mark.parametrize("stride", [[-1, 1], [1.0, 1], "ab", [None, 1]], ids=lambda v: repr(v))
def test_bad_strides(stride):
    g = og.Graph()
    with pytest.raises(og.ShapeError) as ei:
        g.tensor(dim=[2, 2], stride=stride, name="bad")
    assert "[rule tensor.stride]" in str(ei.value) and "'bad'" in str(ei.value)


@pytest.mark.parametrize("uid", [-1, 2**63, "7", 1.0, True], ids=lambda v: repr(v))
def test_bad_uids(uid):
    g = og.Graph()
    with pytest.raises(og.GraphError) as ei:
        g.tensor(dim=[2], uid=uid, name="bad")
    assert "[rule tensor.uid]" in str(ei.value) and "'bad'" in str(ei.value)
    assert g.tensor(dim=[2], uid=np.int64(2**63 - 1)).uid == 2**63 - 1  # the largest int64 is fine


def test_known_accessors_raise_until_the_value_is_set_or_inferred():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor([2, 3], name="x")
    y = g.relu(x, name="r")
    y.set_output(True)
    for read in (y.known_uid, y.known_dim, y.known_stride, y.known_data_type):
        with pytest.raises(og.GraphError) as ei:
            read()
        assert ei.value.rule == "tensor.unknown" and "not known yet" in str(ei.value)
    g.validate()
    assert (y.known_uid(), y.known_dim(), y.known_stride(), y.known_data_type()) == (y.uid, (2, 3), (3, 1), D.FLOAT)
    assert x.known_uid() == x.uid is not None


def test_expect_names_the_broken_invariant():
    from opgraph.core.errors import InternalError, expect

    assert expect(0, "zero") == 0
    with pytest.raises(InternalError) as ei:
        expect(None, "the thing")
    assert "the thing is missing" in str(ei.value) and ei.value.rule == "internal.invariant"
    assert isinstance(ei.value, og.GraphError)


@pytest.mark.parametrize(
    "stride,order",
    [
        ((12, 4, 1), (0, 1, 2)),
        ((150528, 1, 196), (0, 2, 1)),  # a transposed view
        ((768, 768, 1), (0, 1, 2)),  # ties keep the logical order
        ((0, 768, 1), (0, 1, 2)),  # an expanded batch axis stays outermost, where it was
        ((1, 0, 5), (2, 1, 0)),  # a broadcast axis keeps its place among the others
        ((0, 0, 1), (0, 1, 2)),
    ],
)
def test_stride_order_leaves_broadcast_axes_in_their_logical_place(stride, order):
    from opgraph.core.tensor import stride_order

    assert stride_order(stride) == order


# -- reshape strides over dynamic dims (core.tensor.reshape_strides) ------------------------------------


def _packed(dims):
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step = step * d
    return tuple(reversed(strides))


def test_reshape_strides_over_dynamic_dims_split_and_keep_the_dynamic_axes():
    from opgraph.core.symbolic import Dim
    from opgraph.core.tensor import reshape_strides

    b, s = Dim("b", 1, 16), Dim("s", 1, 2048)
    old = (b, s, 1024)
    got = reshape_strides(old, _packed(old), (b, s, 16, 64))
    assert got == (s * 1024, 1024, 64, 1)
    merged = reshape_strides(old, _packed(old), (b * s, 1024))  # rows merged: one run in memory
    assert merged == (1024, 1)
    heads = (b, 16, s, 64)  # the heads transposed in front of the length: not one run
    strides = (s * 1024, 64, 1024, 1)
    assert reshape_strides(heads, strides, (b, 16 * s, 64)) is None
    assert reshape_strides((b, s), (s, 1), (s, b)) is None  # (b vs s: undecided, so refused)


def test_reshape_strides_over_dynamic_dims_agree_with_numpy_where_found():
    """Random regroupings of random layouts: wherever strides are found over the dynamic dims, they
    address the very elements NumPy's reshape of the same view does, at several values of the dims."""
    from opgraph.core.symbolic import Dim, evaluate
    from opgraph.core.tensor import reshape_strides

    rng = np.random.default_rng(0)
    b, s = Dim("b", 1, 8), Dim("s", 1, 8)
    found = 0
    for _ in range(300):
        pool = [b, s, 2, 3, 4, 1]
        dims = [pool[i] for i in rng.choice(len(pool), size=int(rng.integers(2, 5)), replace=False)]
        perm = rng.permutation(len(dims)) if rng.random() < 0.3 else np.arange(len(dims))
        base = _packed(dims)
        old = tuple(dims[p] for p in perm)
        strides = tuple(base[p] for p in perm)
        cut = int(rng.integers(0, len(old)))
        new = (*old[:cut], old[cut] * old[cut + 1], *old[cut + 2 :]) if cut + 1 < len(old) else old
        if rng.random() < 0.5 and isinstance(old[-1], int) and old[-1] % 2 == 0:
            new = (*old[:-1], 2, old[-1] // 2)
        got = reshape_strides(old, strides, new)
        if got is None:
            continue
        found += 1
        for values in ({"b": 2, "s": 3}, {"b": 5, "s": 7}, {"b": 1, "s": 4}):
            at = [evaluate(d, values) if not isinstance(d, int) else d for d in (*dims,)]
            memory = np.arange(int(np.prod(at)))
            view = np.lib.stride_tricks.as_strided(
                memory,
                [evaluate(d, values) if not isinstance(d, int) else d for d in old],
                [8 * (evaluate(t, values) if not isinstance(t, int) else t) for t in strides],
            )
            want = view.reshape([evaluate(d, values) if not isinstance(d, int) else d for d in new])
            mine = np.lib.stride_tricks.as_strided(
                memory, want.shape, [8 * (evaluate(t, values) if not isinstance(t, int) else t) for t in got]
            )
            np.testing.assert_array_equal(mine, want)
    assert found > 50
