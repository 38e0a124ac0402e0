"""The Triton engine: generated kernels, one per piece, from templates.

On CUDA the kernels are compiled by Triton; on the CPU (device="cpu", engines=["triton"]) the very
same kernels run in Triton's interpreter, which is how the tests check them without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from typing import Any, Mapping

import numpy as np

from ...cost import estimate_us
from ...device import Device, cuda_usable
from ...heuristics import HeurMode
from ...partition import Piece
from .. import register_engine
from ..base import BehaviorNote, Engine, EngineConfig, Kernel, NumericalNote, Support
from ...addresses import TABLE_KEY, table_slots
from .indirect import make_indirect
from .rewrite import fp8_fill, typed_scalars
from .launch import Launcher
from .loader import load_module
from .precompile import precompile
from .templates import discover
from .templates.base import Arg, Generated, Template

TEMPLATES: list[Template] = discover()


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("torch") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter. Triton decides this when it is imported (its
    own library functions are compiled or interpreted then), so on a machine without a GPU opgraph
    turns the interpreter on before Triton's first import."""
    if "triton" not in sys.modules and not cuda_usable():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _as_torch(value: Any) -> Any:
    """Kernel argument for a bound buffer: torch tensors pass through; NumPy arrays become zero-copy
    CPU tensors (for the interpreter)."""
    if isinstance(value, np.ndarray):
        import torch

        from ...dtypes import DataType, as_data_type

        dt = as_data_type(value.dtype)
        if dt in (DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2):
            carrier = np.int16 if dt is DataType.BFLOAT16 else np.uint8
            return torch.from_numpy(value.view(carrier)).view(dt.to_torch())
        return torch.from_numpy(value)
    return value


_THREAD = threading.local()


def _ensure_allocator() -> None:
    """Device-side TMA descriptors need Triton's allocator, which is set per thread."""
    if getattr(_THREAD, "allocator", False):
        return
    import torch
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    _THREAD.allocator = True


class TritonKernel(Kernel):
    def __init__(self, piece: Piece, config: EngineConfig, generated: Generated, interpret: bool,
                 device_index: int = 0) -> None:
        super().__init__(piece, config)
        self.generated = generated
        self.interpret = interpret
        self.module = load_module(generated.source, interpret=interpret)
        self.scratch_bytes = generated.scratch_bytes
        self.launchers = [Launcher(getattr(self.module, l.kernel), l.grid, dict(l.meta), direct=not interpret,
                                   device_index=device_index) for l in generated.launches]
        self._scratch_views: dict[tuple[int, int, str], Any] = {}
        self._needs_allocator = "needs_allocator" in generated.notes and not interpret
        self._template_cache: list | None = None
        self._template_key: Any = None
        if not interpret:  # compile now: a kernel that does not compile fails the build, not an execute
            precompile(generated.launches, self.launchers, {u: t.data_type for u, t in piece.graph.tensors.items()},
                       piece.label(), device_index)
        plain = not interpret and all(a.kind in ("buf", "table") for l in generated.launches for a in l.args)
        self._plain = [(tuple(a.uid if a.kind == "buf" else TABLE_KEY for a in l.args), launcher)
                       for l, launcher in zip(generated.launches, self.launchers)] if plain else None

    def source(self) -> str:
        return self.generated.source

    def _scratch(self, scratch: Any, arg: Arg) -> Any:
        base = _as_torch(scratch)
        key = (base.data_ptr(), arg.offset, arg.dtype)
        view = self._scratch_views.get(key)
        if view is None:
            import torch

            view = base[arg.offset:].view(getattr(torch, arg.dtype))
            if len(self._scratch_views) < 64:
                self._scratch_views[key] = view
        return view

    def _arg(self, arg: Arg, buffers: Mapping[int, Any], scratch: Any) -> Any:
        if arg.kind == "buf":
            return _as_torch(buffers[arg.uid])
        if arg.kind == "scalar":
            return float(buffers[arg.uid])
        if arg.kind == "scratch":
            return self._scratch(scratch, arg)
        if arg.kind == "table":
            return buffers[TABLE_KEY]
        raise ValueError(arg.kind)

    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None:
        if self._needs_allocator:
            _ensure_allocator()
        if self._plain:  # CUDA, buffers and scalars only: the hot path, no per-argument dispatch
            for uids, launcher in self._plain:
                launcher([buffers[u] for u in uids], stream)
            return
        if not self.interpret:  # CUDA with scratch or scalars: scratch views are fixed per workspace
            for template, bufs, scalars, launcher in self._templates(scratch):
                args = list(template)
                for i, uid in bufs:
                    args[i] = buffers[uid]
                for i, uid in scalars:
                    args[i] = float(buffers[uid])
                launcher(args, stream)
            return
        # the interpreter evaluates masked-off lanes too (e.g. 0/0 past the end): NumPy's warnings
        # about them are noise
        with np.errstate(all="ignore"):
            for launch, launcher in zip(self.generated.launches, self.launchers):
                launcher([self._arg(a, buffers, scratch) for a in launch.args], stream)

    def _templates(self, scratch: Any) -> list[tuple[list[Any], list[tuple[int, int]], list[tuple[int, int]], Any]]:
        """Per launch: the argument list with the scratch views filled in, and the positions of the
        buffers and scalars to fill per call; cached per scratch buffer."""
        key = None if scratch is None else scratch.data_ptr()
        if self._template_key != key or self._template_cache is None:
            cache = []
            for launch, launcher in zip(self.generated.launches, self.launchers):
                template = [self._arg(a, {}, scratch) if a.kind == "scratch" else None for a in launch.args]
                bufs = [(i, a.uid if a.kind == "buf" else TABLE_KEY) for i, a in enumerate(launch.args)
                        if a.kind in ("buf", "table")]
                scalars = [(i, a.uid) for i, a in enumerate(launch.args) if a.kind == "scalar"]
                cache.append((template, bufs, scalars, launcher))
            self._template_cache, self._template_key = cache, key
        return self._template_cache


class TritonEngine(Engine):
    name = "triton"

    def available(self, device: Device) -> Support:
        if not _triton_installed():
            return Support.no("Triton and PyTorch are not installed (pip install 'opgraph[triton,torch]')")
        if device.is_cuda and interpreting():
            return Support.no("TRITON_INTERPRET=1 is set, so Triton cannot compile for the GPU in this process")
        if not device.is_cuda and not interpreting():
            return Support.no("on the CPU Triton kernels need Triton's interpreter: set TRITON_INTERPRET=1 "
                              "before Triton is first imported")
        return Support.yes()

    def _template(self, piece: Piece, device: Device) -> tuple[Template | None, str]:
        reasons = []
        for t in TEMPLATES:
            verdict = t.match(piece, device)
            if verdict.ok:
                return t, ""
            reasons.append(f"{t.name}: {verdict.reason}")
        return None, "; ".join(reasons)

    def supports(self, piece: Piece, device: Device) -> Support:
        avail = self.available(device)
        if not avail.ok:
            return avail
        template, why = self._template(piece, device)
        return Support.yes() if template else Support.no(why)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        template, _ = self._template(piece, device)
        if template is None:
            return []
        candidates = template.candidates(piece, device)
        notes = (lambda k: frozenset(template.notes(piece, k, device))) if hasattr(template, "notes") else \
            (lambda k: frozenset())
        if mode is not HeurMode.B:
            # the heuristic's pick (FALLBACK: the broadest, last), then the best config of every other
            # numerical class (full-fp32 "ieee" next to tf32), so that a build filtering notes out
            # (deselect_numeric_notes=[DOWN_CONVERT_INPUTS]) still finds a config in these modes
            ordered = candidates[::-1] if mode is HeurMode.FALLBACK else candidates
            picked: dict[frozenset, dict[str, Any]] = {}
            for k in ordered:
                picked.setdefault(notes(k), k)
            candidates = list(picked.values())
        behavior = {BehaviorNote.RUNTIME_COMPILATION, BehaviorNote.DEVICE_SCALARS}
        if device.is_cuda:
            behavior |= {BehaviorNote.CUDA_GRAPH_CAPTURABLE, BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API}
        else:
            behavior |= {BehaviorNote.INTERPRETED, BehaviorNote.HOST_EXECUTION}
        return [
            EngineConfig(
                "triton", (("template", template.name), *sorted(k.items())),
                numerical_notes=notes(k),
                behavior_notes=frozenset(behavior),
                estimate_us=template.estimate(piece, k, device) if hasattr(template, "estimate")
                else estimate_us(piece, device, launches=2 if int(k.get("SPLIT", 1)) > 1 else 1),
                why=f"{template.name} template, {mode.name} heuristic",
            )
            for k in candidates
        ]

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        knobs = dict(config.knobs)
        name = knobs.pop("template")
        template = next(t for t in TEMPLATES if t.name == name)
        generated = fp8_fill(template.generate(piece, knobs, device),
                             {u: t.data_type for u, t in piece.graph.tensors.items()})
        generated = typed_scalars(make_indirect(generated, table_slots(piece.graph)))
        return TritonKernel(piece, config, generated, interpret=not device.is_cuda, device_index=device.index)


register_engine(TritonEngine())
__all__ = ["TritonEngine", "TritonKernel", "TEMPLATES"]
_ = NumericalNote
