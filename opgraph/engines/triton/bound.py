"""Generated kernels bound to a plan's buffers (TritonKernel.bind).

On CUDA each launch is a `NativeLaunch` (native.py) holding its argument slots: the buffers' and the
scratch's addresses, the address table's, the scalars' values, the grid and the stream slot are all
written once when the kernel is bound; `rebind` rewrites only the slots of the tensors that moved.
The binary comes from the compiler's registry (compiled by the build, or embedded in a plan file);
with `build(compile="lazy")` it is compiled here, at the first bind.

A host-side TMA descriptor argument (ArgKind.DESC) is encoded into its slot at bind and again when its
buffer moves (tma_desc.py). Triton's own launch path stays for what the native one does not do: a
pointer that is not 16-byte aligned (the precompiled kernels assume alignment; Triton's JIT specialises and compiles a variant),
kernels whose metadata asks for launch features the native launcher lacks, and OPGRAPH_LAUNCH=jit.
In Triton's interpreter (the CPU) the arguments are the bound arrays as zero-copy tensors, made at
bind, and each call runs the interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...memory.addresses import TABLE_KEY
from ..base import Binding, Launcher
from . import compiler, native, tma_desc
from .interpret import interpreting_here
from .rewrite import OVERLAP
from .templates.base import host_scalar


def launch_mode() -> str:
    mode = os.environ.get("OPGRAPH_LAUNCH", "native")
    return mode if mode in ("native", "jit") else "native"


def overlap_mode(device: Any) -> str:
    """Which kernels generated for `device` are launched overlapping their predecessor's end (programmatic
    dependent launch, compute capability 9.0 and newer: rewrite.overlapped): "triton" (Triton's kernels; the
    default), "all" (Gluon's too: their sm_90a code waits first, but they have not yet run so on a GPU) or
    "off" (OPGRAPH_LAUNCH_OVERLAP=0, e.g. to measure what it gains)."""
    value = os.environ.get("OPGRAPH_LAUNCH_OVERLAP", "1").strip().lower()
    hopper = device.is_cuda and device.capability and tuple(device.capability) >= (9, 0)
    if value in ("0", "off", "no", "false") or not hopper:
        return "off"
    return "all" if value == "all" else "triton"


class _JitLaunch:
    """A launch through Triton's JIT (`fn[grid](*args, **meta)`), arguments as bound objects."""

    def __init__(self, launcher: Any, args: list[Any]) -> None:
        self.launcher, self.args = launcher, args
        self.call = (launcher, (args, None))  # (not a method of this object: no reference cycle)


class TritonLauncher(Launcher):
    """All launches of one TritonKernel on CUDA, bound to a Binding."""

    def __init__(self, kernel: Any, binding: Binding, scratch: Any) -> None:
        super().__init__()
        self.kernel, self.binding = kernel, binding
        self.scratch = scratch
        self.scratch_ptr = int(scratch.data_ptr()) if scratch is not None else 0
        self.device_index = kernel.device_index
        binding.preludes[("cuda-context", self.device_index)] = (native.ensure_context, (self.device_index,))
        users: dict[int, list[tuple[int, int]]] = {}
        self._meta: dict[int, dict[int, Any]] = {}  # launch -> {descriptor argument: its tensordesc_meta entry}
        self._globals: dict[int, Any] = {}  # launch -> its global scratch
        for li, launch in enumerate(kernel.generated.launches):
            for ai, arg in enumerate(launch.args):
                if arg.kind in ("buf", "scalar", "desc"):
                    users.setdefault(arg.uid, []).append((li, ai))
        # (tuples of ints, which the garbage collector stops tracking: a dynamic plan binds every new shape)
        self.users = {u: tuple(v) for u, v in users.items()}
        self.launches = [self._make(li) for li in range(len(kernel.generated.launches))]
        self.calls = [x.call for x in self.launches]

    def _value(self, li: int, ai: int) -> Any:
        arg = self.kernel.generated.launches[li].args[ai]
        if arg.kind == "buf":
            return self.binding.pointers[arg.uid]
        if arg.kind == "scalar":
            return self.binding.buffers[arg.uid]
        if arg.kind == "scratch":
            return self.scratch_ptr + arg.offset
        if arg.kind == "size":
            return arg.value
        if arg.kind == "desc":
            return tma_desc.address(
                arg, self.binding.pointers[arg.uid], self.kernel.piece.tensor(arg.uid).data_type.itemsize
            )
        return self.binding.pointers[TABLE_KEY]

    def _object(self, li: int, ai: int) -> Any:
        """The argument as Triton's JIT takes it (a tensor, or a float)."""
        arg = self.kernel.generated.launches[li].args[ai]
        if arg.kind == "buf":
            return self.binding.buffers[arg.uid]
        if arg.kind == "scalar":
            return host_scalar(arg, self.binding.buffers[arg.uid])
        if arg.kind == "scratch":
            import torch

            return self.scratch[arg.offset :].view(getattr(torch, arg.dtype))
        if arg.kind == "size":
            return arg.value
        if arg.kind == "desc":
            return tma_desc.descriptor_object(arg, self.binding.buffers[arg.uid], self.kernel.gluon(li))
        return self.binding.buffers[TABLE_KEY]

    def _make(self, li: int) -> Any:
        launch = self.kernel.generated.launches[li]
        values = [self._value(li, ai) for ai in range(len(launch.args))]
        aligned = all(v % 16 == 0 for v, a in zip(values, launch.args) if a.kind not in ("scalar", "size"))
        spec = self.kernel.spec(li) if aligned and launch_mode() == "native" else None
        binary = self.kernel.binary(li) if spec is not None else None
        descs = [ai for ai, a in enumerate(launch.args) if a.kind == "desc"]
        meta = (binary.meta("tensordesc_meta") if binary is not None else None) or []
        if binary is not None and native.unsupported(binary.metadata) is None and tma_desc.launchable(meta, len(descs)):
            need, align = self.kernel.global_scratch(li, binary)
            global_scratch = 0
            if need:  # per-program scratch the kernel asks for: one buffer for the binding's life,
                # reserved with the thread's state (Kernel.global_scratch_bytes: not made inside a capture)
                import torch

                memory = self.binding.reserved.get((id(self.kernel), li))
                if memory is None or memory.numel() < need:
                    memory = torch.empty(need, dtype=torch.uint8, device=f"cuda:{self.device_index}")
                self._globals[li] = memory  # (kept: the launch holds its address)
                global_scratch = -(-memory.data_ptr() // align) * align
            function = native.load(
                binary.identity,
                binary.name,
                binary.cubin,
                int(binary.meta("shared", 0)),
                self.device_index,
                int(binary.meta("num_warps", 4)),
            )
            types = tuple(ty for _, ty in spec.runtime)  # type: ignore[union-attr]
            out = native.NativeLaunch(
                function,
                self.kernel.grid(li),
                int(binary.meta("num_warps", 4)),
                int(binary.meta("shared", 0)),
                types,
                self.binding.stream.c,
                global_scratch,
                overlap=OVERLAP in self.kernel.generated.notes,
            )
            for ai, v in enumerate(values):
                if ai in descs:
                    out.set_descriptor(ai, launch.args[ai], v, meta[descs.index(ai)])
                else:
                    out.set(ai, v)
            if descs:
                self._meta[li] = {ai: meta[j] for j, ai in enumerate(descs)}
            return out
        return _JitLaunch(self.kernel.launchers[li], [self._object(li, ai) for ai in range(len(launch.args))])

    def rebind(self, uids: Iterable[int]) -> bool:
        changed = False
        stale: set[int] = set()
        for uid in uids:
            for li, ai in self.users.get(uid, ()):
                launch = self.launches[li]
                if isinstance(launch, native.NativeLaunch):
                    value = self._value(li, ai)
                    desc = ai in self._meta.get(li, {})
                    if (desc or launch.types[ai].startswith("*")) and value % 16:
                        stale.add(li)  # no longer aligned: Triton's JIT takes it
                    elif desc:  # encoded again for the new address (tma_desc.py)
                        launch.set_descriptor(
                            ai, self.kernel.generated.launches[li].args[ai], value, self._meta[li][ai]
                        )
                    else:
                        launch.set(ai, value)
                else:
                    stale.add(li)
        for li in stale:
            self.launches[li] = self._make(li)
            changed = True
        if changed:
            self.calls = [x.call for x in self.launches]
        return changed


class InterpretedLauncher(Launcher):
    """Triton's interpreter (CPU): the arguments as zero-copy tensors of the bound arrays, made at
    bind and when tensors move."""

    def __init__(self, kernel: Any, binding: Binding, scratch: Any) -> None:
        super().__init__()
        self.kernel, self.binding, self.scratch = kernel, binding, scratch
        self._args = [self._build()]  # (a cell rebind refills: the call holds it, not this launcher)
        self.calls = [(_run_interpreted, (self._args, kernel.launchers))]

    def _build(self) -> list[list[Any]]:
        from . import _as_torch

        out = []
        for li, launch in enumerate(self.kernel.generated.launches):
            args = []
            for a in launch.args:
                if a.kind == "buf":
                    args.append(_as_torch(self.binding.buffers[a.uid]))
                elif a.kind == "scalar":
                    args.append(host_scalar(a, self.binding.buffers[a.uid]))
                elif a.kind == "scratch":
                    import torch

                    args.append(_as_torch(self.scratch)[a.offset :].view(getattr(torch, a.dtype)))
                elif a.kind == "desc":
                    args.append(
                        tma_desc.descriptor_object(a, _as_torch(self.binding.buffers[a.uid]), self.kernel.gluon(li))
                    )
                elif a.kind == "size":
                    args.append(a.value)
                else:
                    args.append(self.binding.buffers[TABLE_KEY])
            out.append(args)
        return out

    def rebind(self, uids: Iterable[int]) -> bool:
        self._args[0] = self._build()
        return False


def _run_interpreted(cell: list[list[list[Any]]], launchers: Sequence[Any]) -> None:
    # the interpreter evaluates masked-off lanes too (e.g. 0/0 past the end): NumPy's warnings
    # about them are noise; JITFunctions the kernels call run interpreted too (interpret.py)
    with np.errstate(all="ignore"), interpreting_here():
        for args, launcher in zip(cell[0], launchers):
            launcher(args, None)


__all__ = ["InterpretedLauncher", "TritonLauncher", "compiler"]
