"""memory.fill: host buffers with a descriptor's exact layout, copies that keep it, poison, and random
non-zero values of every type."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import opgraph as og
from opgraph.memory.fill import clone, empty_like_desc, poison, random_values
from opgraph.tools.samples import nhwc

DT = og.DataType
DIMS = (2, 3, 4, 5)


def desc(dt=DT.FLOAT, dim=DIMS, stride=None) -> og.TensorDesc:
    return og.TensorDesc(1, "t", tuple(dim), tuple(stride or nhwc(list(dim))), dt)


def storage(arr: np.ndarray) -> np.ndarray:
    """The array that owns `arr`'s memory (through views and as_strided's wrappers)."""
    o = arr
    while not (isinstance(o, np.ndarray) and o.flags.owndata):
        o = o.base
    return o


def element_strides(arr: np.ndarray) -> tuple[int, ...]:
    return tuple(s // arr.itemsize for s in arr.strides)


@pytest.mark.parametrize("dt", list(DT), ids=lambda d: d.name)
def test_empty_like_desc_has_the_descriptors_layout(dt):
    d = desc(dt)
    arr = empty_like_desc(d)
    assert arr.shape == d.dim and element_strides(arr) == d.stride and arr.dtype == dt.numpy
    assert storage(arr).nbytes == d.nbytes  # storage of its own, as big as the layout


@pytest.mark.parametrize(
    "dim,stride,extent",
    [((3, 4), (0, 1), 4), ((2, 3), (1, 2), 6), ((0, 4), (4, 1), 1), ((1,), (1,), 1), ((2, 2), (8, 1), 10)],
    ids=["broadcast", "column-major", "empty", "scalar", "padded rows"],
)
def test_empty_like_desc_of_unusual_layouts(dim, stride, extent):
    arr = empty_like_desc(og.TensorDesc(1, "t", dim, stride, DT.HALF))
    assert arr.shape == dim and element_strides(arr) == stride
    assert storage(arr).nbytes == extent * 2  # exactly the elements the layout reaches (one at least)


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16, DT.FP8_E5M2, DT.INT32, DT.BOOLEAN], ids=lambda d: d.name)
def test_clone_keeps_strides_and_values_in_new_memory(dt, rng):
    src = random_values(desc(dt), rng)
    copy = clone(src)
    assert element_strides(copy) == element_strides(src) and copy.dtype == src.dtype
    np.testing.assert_array_equal(copy.astype(np.float64), src.astype(np.float64))
    assert not np.shares_memory(copy, src)
    t = clone(src.transpose(1, 0, 3, 2))  # any view keeps its own strides
    assert element_strides(t) == element_strides(src.transpose(1, 0, 3, 2))
    np.testing.assert_array_equal(t.astype(np.float64), src.transpose(1, 0, 3, 2).astype(np.float64))


@pytest.mark.parametrize("dt", list(DT), ids=lambda d: d.name)
def test_poison_fills_with_a_value_no_kernel_writes(dt, rng):
    arr = random_values(desc(dt), rng)
    assert poison(arr) is arr
    if dt is DT.BOOLEAN:
        assert arr.all()
    elif dt.is_integer:
        assert (arr == np.iinfo(dt.numpy).max).all()
    else:
        assert np.isnan(arr.astype(np.float64)).all()


@pytest.mark.parametrize("dt", list(DT), ids=lambda d: d.name)
def test_random_values_are_nonzero_in_range_and_of_the_layout(dt, rng):
    d = desc(dt)
    arr = random_values(d, rng)
    assert arr.shape == d.dim and element_strides(arr) == d.stride and arr.dtype == dt.numpy
    v = arr.astype(np.float64)
    if dt is DT.BOOLEAN:
        assert 0 < v.sum() < v.size  # both values drawn
        return
    assert (v != 0).all() and np.isfinite(v).all()
    if dt is DT.UINT8:
        assert v.min() >= 1 and v.max() <= 7
    elif dt.is_integer:
        assert v.min() >= -8 and v.max() <= 7
    else:
        assert v.min() >= -2.0 - 0.25 and v.max() <= 2.0 + 0.25  # the range, after rounding to the type
    assert len(np.unique(v)) > 4  # not one value repeated


def test_random_integers_are_exact_in_every_float_type(rng):
    for dt in (DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.FP8_E4M3):
        v = random_values(desc(dt), rng, integers=True, low=-3, high=3).astype(np.float64)
        assert set(np.unique(v)) <= {-3.0, -2.0, -1.0, 1.0, 2.0, 3.0} and len(np.unique(v)) == 6


def test_random_values_follow_the_range_and_the_seed():
    d = desc(DT.DOUBLE)
    a = random_values(d, np.random.default_rng(5), low=10.0, high=11.0)
    b = random_values(d, np.random.default_rng(5), low=10.0, high=11.0)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 10.0 and a.max() < 11.0
    c = random_values(d, np.random.default_rng(6), low=10.0, high=11.0)
    assert not np.array_equal(a, c)


def test_values_near_zero_are_moved_away_from_it():
    d = desc(DT.DOUBLE)
    v = random_values(d, np.random.default_rng(0), low=-1e-4, high=1e-4)  # every draw is "near zero"
    assert (v == 0.5).all()


def test_bfloat16_buffers_are_ml_dtypes():
    assert empty_like_desc(desc(DT.BFLOAT16)).dtype == np.dtype(ml_dtypes.bfloat16)
