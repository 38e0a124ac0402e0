"""memory.buffers: buffer_info of NumPy arrays, PyTorch CPU tensors, DLPack and __cuda_array_interface__
objects (dims, element strides, type, device, address, a zero-copy object to compute on), and typed
refusals of everything else."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import opgraph as og
from opgraph.memory.buffers import address_of, buffer_info, tensor_from_pointer

from ..helpers import check_rule, torch_or_skip

DT = og.DataType


def refused(obj, cls=og.VariantPackError) -> og.GraphError:
    with pytest.raises(cls) as err:
        buffer_info(obj)
    return err.value


@pytest.mark.parametrize("dt", list(DT), ids=lambda d: d.name)
def test_numpy_arrays_of_every_type(dt):
    arr = np.zeros((2, 3), dt.numpy)
    info = buffer_info(arr)
    assert (info.shape, info.strides, info.data_type, info.device) == ((2, 3), (3, 1), dt, "cpu")
    assert info.ptr == arr.ctypes.data and info.obj is arr


@pytest.mark.parametrize(
    "view,strides",
    [
        (lambda a: a.T, (1, 4)),
        (lambda a: a[::-1, ::2], (-4, 2)),
        (lambda a: a[1:, 1:], (4, 1)),
        (lambda a: np.broadcast_to(a[:1], (3, 4)), (0, 1)),
    ],
    ids=["transposed", "reversed and stepped", "offset", "broadcast"],
)
def test_numpy_views_keep_their_element_strides_and_first_element(view, strides):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = view(arr)
    info = buffer_info(v)
    assert info.strides == strides and info.shape == v.shape
    # the address of element [0, 0] (arr holds each element's flat index)
    assert info.ptr == arr.ctypes.data + arr.itemsize * int(v[0, 0])


def test_byte_strides_that_split_elements_are_refused():
    raw = np.zeros(64, np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.float32), shape=(3, 2), strides=(6, 4))
    err = check_rule(refused(odd), "pack.strides")
    assert "[6, 4]" in str(err) and "element size 4" in str(err)
    # a stride along a dimension of size 1 is never used: no matter what it is
    one = np.lib.stride_tricks.as_strided(raw.view(np.float32), shape=(1, 2), strides=(6, 4))
    assert buffer_info(one).shape == (1, 2)


@pytest.mark.parametrize(
    "dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.FP8_E4M3, DT.FP8_E5M2, DT.INT8, DT.BOOLEAN], ids=lambda d: d.name
)
def test_torch_cpu_tensors_become_numpy_views_of_the_same_memory(dt, rng):
    torch = torch_or_skip()
    base = torch.from_numpy(rng.integers(1, 5, size=(4, 6)).astype(np.float32)).to(dt.to_torch())
    t = base.t()[1:]  # transposed, with a storage offset
    info = buffer_info(t)
    assert (info.shape, info.strides, info.data_type, info.device) == ((5, 4), (1, 6), dt, "cpu")
    assert info.ptr == t.data_ptr() == address_of(t)
    arr = info.obj
    assert isinstance(arr, np.ndarray) and arr.dtype == dt.numpy and arr.shape == (5, 4)
    np.testing.assert_array_equal(arr.astype(np.float64), t.to(torch.float64).numpy())
    assert arr.ctypes.data == t.data_ptr()  # no copy: the NumPy view reads the tensor's memory


def test_a_torch_tensor_that_requires_grad(rng):
    torch = torch_or_skip()
    t = torch.ones(3, requires_grad=True)
    info = buffer_info(t)
    info.obj[1] = 5.0  # the view writes into the tensor
    assert t.detach()[1].item() == 5.0


class DLPackOnly:
    """An object that is a buffer only through the DLPack protocol."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, *args, **kw):
        return self._arr.__dlpack__(*args, **kw)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


@pytest.mark.parametrize("with_torch", [True, False], ids=["torch loaded", "numpy only"])
def test_dlpack_objects(monkeypatch, with_torch):
    if with_torch:
        torch_or_skip()
    else:
        monkeypatch.setitem(sys.modules, "torch", None)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:]
    info = buffer_info(DLPackOnly(arr))
    assert (info.shape, info.strides, info.data_type, info.device) == ((3, 3), (4, 1), DT.FLOAT, "cpu")
    assert info.ptr == arr.__array_interface__["data"][0]
    assert isinstance(info.obj, np.ndarray) and np.shares_memory(info.obj, arr)
    np.testing.assert_array_equal(info.obj, arr)


class CudaArray:
    def __init__(self, **cai) -> None:
        self.__cuda_array_interface__ = {"version": 3, "data": (0x7F0000000000, False), **cai}


def test_cuda_array_interface_objects_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    packed = buffer_info(CudaArray(shape=(2, 3), typestr="<f4", strides=None))
    assert (packed.shape, packed.strides, packed.data_type, packed.device) == ((2, 3), (3, 1), DT.FLOAT, "cuda:0")
    assert packed.ptr == 0x7F0000000000
    strided = buffer_info(CudaArray(shape=(2, 3), typestr="<f2", strides=(2, 4)))
    assert strided.strides == (1, 2) and strided.data_type is DT.HALF
    err = check_rule(refused(CudaArray(shape=(2,), typestr="<c8")), "pack.dtype")
    assert "'<c8'" in str(err)


@pytest.mark.parametrize(
    "obj", [[1.0, 2.0], 3, 2.5, "x", None, {"a": 1}, object(), b"\x00\x01"], ids=lambda o: type(o).__name__
)
def test_what_is_not_a_buffer_is_refused_by_type(obj):
    err = check_rule(refused(obj), "pack.type")
    assert f"a {type(obj).__name__} is not a buffer opgraph can use" in str(err)


def test_an_array_interface_alone_is_not_a_buffer():
    """Host objects are taken as NumPy arrays, torch tensors or through DLPack (the documented kinds)."""

    class HostArray:
        def __init__(self) -> None:
            self._keep = np.zeros(4, np.float32)
            self.__array_interface__ = self._keep.__array_interface__

    check_rule(refused(HostArray()), "pack.type")


@pytest.mark.parametrize("dtype", [np.complex64, np.uint16, np.dtype("i2,f4"), object])
def test_element_types_opgraph_does_not_know(dtype):
    err = refused(np.zeros(3, dtype), og.DataTypeError)
    assert err.rule == "dtype.unknown"


def test_unknown_torch_type():
    torch = torch_or_skip()
    assert refused(torch.zeros(3, dtype=torch.complex64), og.DataTypeError).rule == "dtype.unknown"


@pytest.mark.gpu
def test_cuda_tensors_and_raw_pointers():
    torch = torch_or_skip()
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6).t()
    info = buffer_info(t)
    assert info.device == "cuda:0" and info.obj is t and info.strides == (1, 6) and info.ptr == t.data_ptr()
    view = tensor_from_pointer(t.data_ptr(), (6, 4), (1, 6), DT.FLOAT, 0)
    assert view.data_ptr() == t.data_ptr() and torch.equal(view, t)
    cai = buffer_info(CudaArray(**t.__cuda_array_interface__))  # through torch: a zero-copy tensor
    assert cai.ptr == t.data_ptr() and cai.strides == (1, 6) and torch.equal(cai.obj, t)
