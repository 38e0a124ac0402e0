"""Loading and launching compiled kernels through the CUDA driver API, with prebuilt arguments.

Why a launcher of our own rather than Triton's: a kernel's arguments are a fixed list of pointers and
scalars whose values change rarely (a new buffer address, a new scalar value) while launches happen
every execute. Here each launch owns its argument slots (ctypes objects), the array of their
addresses that `cuLaunchKernel` reads, and one prebuilt argument tuple; binding a new address writes
one slot, and a launch is a single foreign call with nothing to convert or look up (no `data_ptr()`
calls, no argument parsing, no per-signature launcher compiled with gcc, as Triton's is on first use
of each signature). The stream is one `c_void_p` shared by every launch of a binding
(engines.base.StreamSlot), set once per execute.

The kernel ABI is Triton's (3.x): the non-constexpr parameters in order, then the global-scratch and
profile-scratch pointers; block = 32 x num_warps threads; `shared` bytes of dynamic shared memory
(opted in above 48 KiB when the module is loaded). A host-side tensor descriptor parameter is three
kinds of slots: its 128-byte CUtensorMap, then its shape and strides (tma_desc.py says why and how it is
encoded). Kernels that need what this launcher does not do (clusters, cooperative launches or Triton's own
`launch_pdl`, descriptors it cannot encode, profile scratch) say so in `unsupported`, and the caller launches
them through Triton instead.

A kernel that waits for its predecessor (rewrite.overlapped) is launched by `cuLaunchKernelEx` with
programmatic stream serialization allowed: the driver may launch it once every program of the kernel
before it has signalled (each does so first thing), so its launch and its programs' start overlap that
kernel's last wave; its programs then wait for that kernel's end and memory. A stream capture records the
same as a programmatic edge of the CUDA graph.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from ...core.errors import ExecutionError
from . import tma_desc

_LOCK = threading.RLock()  # load() holds it and may create the driver
_DRIVER: Any = None
_LOADED: dict[tuple[str, int], tuple[int, int]] = {}  # (binary key, device) -> (module, function)

CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_FUNC_CACHE_PREFER_SHARED = 2
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, then a 64-byte union of values (8-byte aligned)."""

    _fields_ = [
        ("id", ctypes.c_int),
        ("pad", ctypes.c_int),
        ("value", ctypes.c_int),
        ("pad2", ctypes.c_int),
        ("rest", ctypes.c_uint64 * 7),  # (8-byte words: the union's alignment, as in C)
    ]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuLaunchKernelEx's first argument)."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


class _Driver:
    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        self.launch_ex = getattr(lib, "cuLaunchKernelEx", None)  # (CUDA 12.0+ drivers)
        if self.launch_ex is not None:
            self.launch_ex.restype = ctypes.c_int
        version = ctypes.c_int()
        lib.cuDriverGetVersion.restype = ctypes.c_int
        self.version = version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0
        for name in (
            "cuInit",
            "cuModuleLoadData",
            "cuModuleGetFunction",
            "cuFuncGetAttribute",
            "cuFuncSetAttribute",
            "cuFuncSetCacheConfig",
            "cuDeviceGetAttribute",
            "cuCtxGetCurrent",
            "cuCtxSetCurrent",
            "cuDevicePrimaryCtxRetain",
            "cuDeviceGet",
            "cuGetErrorString",
        ):
            getattr(lib, name).restype = ctypes.c_int

    @property
    def overlaps(self) -> bool:
        """Whether launches may overlap their predecessor: cuLaunchKernelEx, and stream captures that record
        programmatic edges (CUDA 12.3+ drivers); otherwise overlapped kernels launch plainly (their waits
        then return at once)."""
        return self.launch_ex is not None and self.version >= 12030

    _encode: Any = None

    def encode(self) -> Any:
        """cuTensorMapEncodeTiled (CUDA 12+ drivers), looked up on first use."""
        if self._encode is None:
            try:
                self._encode = tma_desc.encoder(self.lib)
            except AttributeError:
                raise ExecutionError(
                    "this CUDA driver has no cuTensorMapEncodeTiled (TMA descriptors need CUDA 12+)",
                    rule="triton.driver",
                    hint="use a config without TMA_HOST",
                ) from None
        return self._encode

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise ExecutionError(
                f"the CUDA driver failed to {what}: {self.error(rc)}",
                rule="triton.driver",
                hint="check the device and the kernel (OPGRAPH_LAUNCH=jit uses Triton's launcher)",
            )

    def error(self, rc: int) -> str:
        text = ctypes.c_char_p()
        self.lib.cuGetErrorString(rc, ctypes.byref(text))
        return f"{text.value.decode() if text.value else 'unknown error'} (CUresult {rc})"


def driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        with _LOCK:
            if _DRIVER is None:
                _DRIVER = _Driver()
    return _DRIVER


_SHARED_LIMIT: dict[int, int] = {}


def shared_limit(device_index: int = 0) -> int:
    """The most dynamic shared memory a block of the device may opt in to (bytes; cached)."""
    found = _SHARED_LIMIT.get(device_index)
    if found is None:
        d = driver()
        dev, optin = ctypes.c_int(), ctypes.c_int()
        d.check(d.lib.cuInit(0), "initialise")
        d.check(d.lib.cuDeviceGet(ctypes.byref(dev), device_index), "get the device")
        d.check(
            d.lib.cuDeviceGetAttribute(ctypes.byref(optin), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
            "query shared memory",
        )
        found = _SHARED_LIMIT[device_index] = optin.value
    return found


def too_big(shared: int, device_index: int = 0) -> str | None:
    """Why a kernel using `shared` bytes of dynamic shared memory cannot run on the device (None: it can)."""
    if shared <= 49152:  # every device since Volta gives a block this much without opting in
        return None
    limit = shared_limit(device_index)
    return f"needs {shared} bytes of shared memory, the device has {limit}" if shared > limit else None


_THREAD = threading.local()


def ensure_context(device_index: int) -> None:
    """Make the device's primary context current in this thread if no context is (a thread that has
    not touched CUDA yet); a launch needs one. Checked with the driver once per thread."""
    if getattr(_THREAD, "checked", None) == device_index:
        return
    d = driver()
    ctx = ctypes.c_void_p()
    d.lib.cuCtxGetCurrent(ctypes.byref(ctx))
    _THREAD.checked = device_index
    if not ctx.value:
        dev = ctypes.c_int()
        d.check(d.lib.cuDeviceGet(ctypes.byref(dev), device_index), "get the device")
        d.check(d.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain the primary context")
        d.check(d.lib.cuCtxSetCurrent(ctx), "make the context current")


def unsupported(metadata: dict[str, Any]) -> str | None:
    """Why the native launcher cannot launch a kernel with this metadata (None: it can)."""
    if int(metadata.get("num_ctas", 1)) != 1:
        return "a cluster launch (num_ctas > 1)"
    if metadata.get("launch_cooperative_grid") or metadata.get("launch_pdl"):
        return "a cooperative or programmatic-dependent launch"
    meta = metadata.get("tensordesc_meta")
    if meta and not tma_desc.launchable(meta, len(meta)):
        return "tensor-descriptor arguments it cannot encode (im2col, fp4)"
    if int(metadata.get("profile_scratch_size") or 0):
        return "profile scratch (instrumentation)"
    return None


def load(key: str, name: str, cubin: bytes, shared: int, device_index: int, num_warps: int) -> int:
    """The CUfunction of a cubin on a device (loaded once per process and device)."""
    found = _LOADED.get((key, device_index))
    if found is not None:
        return found[1]
    with _LOCK:
        found = _LOADED.get((key, device_index))
        if found is not None:
            return found[1]
        d = driver()
        ensure_context(device_index)
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        d.check(d.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), f"load kernel {name}")
        d.check(d.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), f"find kernel {name}")
        threads = ctypes.c_int()
        d.check(
            d.lib.cuFuncGetAttribute(ctypes.byref(threads), CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
            "query the kernel",
        )
        if num_warps * 32 > threads.value:
            raise ExecutionError(
                f"kernel {name} needs {num_warps * 32} threads per block, the device allows {threads.value} for it",
                rule="triton.resources",
                hint="pick a config with fewer warps",
            )
        if shared > 49152:
            why = too_big(shared, device_index)
            if why:
                raise ExecutionError(
                    f"kernel {name} {why}", rule="triton.resources", hint="pick a config with smaller tiles"
                )
            static = ctypes.c_int()
            d.check(d.lib.cuFuncSetCacheConfig(function, CU_FUNC_CACHE_PREFER_SHARED), "prefer shared memory")
            d.check(
                d.lib.cuFuncGetAttribute(ctypes.byref(static), CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                "query the kernel",
            )
            d.check(
                d.lib.cuFuncSetAttribute(
                    function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_limit(device_index) - static.value
                ),
                "opt in to shared memory",
            )
        _LOADED[(key, device_index)] = (module.value or 0, function.value or 0)
        return function.value or 0


def _pack(ty: str, value: Any) -> Any:
    if ty == "fp16":
        return struct.unpack("<H", struct.pack("<e", float(value)))[0]
    if ty == "bf16":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16
    return float(value) if ty.startswith("fp") or ty == "f32" else int(value)


_WORD = (1 << 64) - 1


def _bits(ty: str, value: Any) -> int:
    """A runtime argument's value as the bits of its 8-byte word (little-endian: a narrower parameter
    reads the low bytes)."""
    if ty.startswith("*"):
        return int(value) & _WORD
    packed = _pack(ty, value)
    if ty in ("fp32", "f32"):  # (through a C float: beyond its range is inf, as a kernel's cast makes it)
        return struct.unpack("<I", bytes(ctypes.c_float(packed)))[0]
    if ty == "fp64":
        return struct.unpack("<Q", struct.pack("<d", packed))[0]
    return packed & _WORD


_LAYOUTS: dict[tuple[str, ...], tuple[tuple[int, ...], tuple[int, ...], int]] = {}
_FUNCTION_ARGS: dict[int, ctypes.c_void_p] = {}


def _layout(types: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Where a signature's arguments sit (memoized per signature): per runtime argument its first
    parameter, per parameter its 8-byte word (-1: a descriptor's map, a TensorMapSlot of its own), and
    the words in all (the global and profile scratch pointers last)."""
    found = _LAYOUTS.get(types)
    if found is None:
        index: list[int] = []
        words: list[int] = []
        for ty in types:
            index.append(len(words))
            rank = tma_desc.rank_of(ty)
            if rank:
                words.append(-1)
            words += [sum(w >= 0 for w in words) + j for j in range(2 * rank if rank else 1)]
        n = sum(w >= 0 for w in words)
        words += [n, n + 1]
        found = _LAYOUTS[types] = (tuple(index), tuple(words), n + 2)
    return found


class NativeLaunch:
    """One kernel launch with its argument slots. `set(i, value)` writes runtime argument i (a pointer
    as an int, a scalar as a number), `set_descriptor(i, ...)` encodes descriptor argument i; `call` is the
    (function, args) pair an execute makes.

    The slots are the 8-byte words of one ctypes array (a descriptor's 128-byte map apart), and the
    launch holds a handful of objects: a plan keeps a launch per kernel launch for each shape it runs,
    and every object kept counts toward the garbage collector's full passes."""

    def __init__(
        self,
        function: int,
        grid: tuple[int, int, int],
        num_warps: int,
        shared: int,
        types: tuple[str, ...] | list[str],
        stream_c: ctypes.c_void_p,
        global_scratch: int = 0,
        overlap: bool = False,
    ) -> None:
        self.types = types = tuple(types)
        self.index, layout, n = _layout(types)
        # one array: the parameters' addresses (the kernelParams cuLaunchKernel reads), then their words
        count = len(layout)
        self.words = words = tuple(count + w if w >= 0 else -1 for w in layout)
        self.memory = memory = (ctypes.c_uint64 * (count + n))()
        base = ctypes.addressof(memory)
        self.maps = {i: tma_desc.TensorMapSlot() for i, ty in enumerate(types) if words[self.index[i]] < 0}
        for k, w in enumerate(words):
            memory[k] = base + 8 * w
        for i, slot in self.maps.items():
            memory[self.index[i]] = slot.address
        memory[count + n - 2] = global_scratch  # (the profile scratch pointer stays 0)
        self.params = memory  # (passed as a pointer to its first element)
        gx, gy, gz = grid
        fn = _FUNCTION_ARGS.get(function)
        if fn is None:
            fn = _FUNCTION_ARGS[function] = ctypes.c_void_p(function)
        # (plain ints: cuLaunchKernel's unsigned sizes fit a C int)
        self.args = (fn, gx, gy, gz, 32 * num_warps, 1, 1, shared, stream_c, self.params, None)
        self.empty = gx * gy * gz == 0
        self.call: tuple[Any, tuple[Any, ...]] = (driver().launch, self.args) if not self.empty else (_nothing, ())
        if overlap and not self.empty and driver().overlaps:
            self.config = overlapping_config(grid, num_warps, shared)
            self.call = (_launch_overlapped, (self.config, stream_c, fn, self.params))

    def set(self, i: int, value: Any) -> None:
        word = self.words[self.index[i]]
        assert word >= 0, f"argument {i} is a descriptor: set_descriptor encodes it"
        self.memory[word] = _bits(self.types[i], value)

    def set_descriptor(self, i: int, arg: Any, global_address: int, meta: dict[str, Any]) -> None:
        """Encode descriptor argument i (a templates.base.Arg of kind DESC) at `global_address`, with the
        kernel's `tensordesc_meta` entry for it."""
        d = driver()
        slot = self.maps[i]
        same = slot.holds(arg)  # (a moved buffer: the dims and strides after the map are as they were)
        slot.encode(d.encode(), d.check, arg, global_address, meta)
        if same:
            return
        at, rank, words, memory = self.index[i], len(arg.shape), self.words, self.memory
        for j, (dim, stride) in enumerate(zip(arg.shape, arg.strides)):
            memory[words[at + 1 + j]] = int(dim) & _WORD
            memory[words[at + 1 + rank + j]] = int(stride) & _WORD


def _nothing() -> None:
    return None


def overlapping_config(grid: tuple[int, int, int], num_warps: int, shared: int) -> LaunchConfig:
    """A launch's CUlaunchConfig with programmatic stream serialization allowed (its stream set per call)."""
    attribute = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = LaunchConfig(*grid, 32 * num_warps, 1, 1, shared, None, ctypes.pointer(attribute), 1)
    config._attribute = attribute  # (kept alive with the config)
    return config


def _launch_overlapped(config: LaunchConfig, stream: ctypes.c_void_p, fn: ctypes.c_void_p, params: Any) -> int:
    config.hStream = stream.value
    return int(_DRIVER.launch_ex(ctypes.byref(config), fn, params, None))
