"""The Triton engine: generated kernels, one per piece, from templates.

On CUDA the kernels are compiled by Triton; on the CPU (device="cpu", engines=["triton"]) the very
same kernels run in Triton's interpreter, which is how the tests check them without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from ...core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ...core.device import Device
from ...core.dtypes import DataType
from ...core.errors import AttributeValueError, ExecutionError
from ...core.evolve import evolve
from ...core.piece import Piece
from ...memory.addresses import TABLE_KEY, table_slots
from .. import register_engine
from ..base import Binding, Compiler, Engine, EngineFacts, Kernel
from ..base import Launcher as BaseLauncher
from ..cost import estimate_us
from . import compiler, tma_desc
from .bound import InterpretedLauncher, TritonLauncher, overlap_mode
from .indirect import make_indirect
from .interpret import interpreting_here, triton_imported_interpreting
from .knobs import Knobs
from .launch import Launcher, grid3
from .loader import load_module, module_file, module_name
from .rewrite import fp8_fill, overlapped, typed_scalars, without_overlap
from .sizes import divides
from .templates import discover
from .templates.base import Arg, ArgKind, Generated, Match, Template, host_scalar

TEMPLATES: list[Template] = discover()
TEMPLATE_BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}


def estimate(match: Match[Any], knobs: Knobs) -> float | None:
    """The template's own estimate of a config, else the generic bytes-and-math one (None off CUDA)."""
    own = match.estimate(knobs)
    if own is not None:
        return own
    return estimate_us(match.piece, match.device, launches=match.launches(knobs))


def generate(template: Template, piece: Piece, knobs: Mapping[str, Any], device: Device) -> Generated:
    """The source and launches of a config of `template` (stored knobs, without ("template", name))."""
    return template.generate(piece, knobs, device)


def _is_gluon(fn: Any) -> bool:
    """Whether a generated kernel is Gluon's (gluon_prelude.py): its descriptors' types name their layouts."""
    return bool(getattr(fn, "is_gluon", lambda: False)())


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("torch") is not None


def interpreting() -> bool:
    """Whether Triton's library is in interpreter form in this process (TRITON_INTERPRET was set when
    Triton was imported): then the engine cannot compile for a GPU here. The CPU needs no variable:
    kernels for the CPU always run in the interpreter (see interpret.py)."""
    return triton_imported_interpreting()


def _as_torch(value: Any) -> Any:
    """Kernel argument for a bound buffer: torch tensors pass through; NumPy arrays become zero-copy
    CPU tensors (for the interpreter)."""
    if isinstance(value, np.ndarray):
        import torch

        from ...core.dtypes import DataType, as_data_type

        dt = as_data_type(value.dtype)
        if dt in (DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2):
            carrier = np.int16 if dt is DataType.BFLOAT16 else np.uint8
            return torch.from_numpy(value.view(carrier)).view(dt.to_torch())
        return torch.from_numpy(value)
    return value


_THREAD = threading.local()
_SET = object.__setattr__


def _ensure_allocator() -> None:
    """Device-side TMA descriptors need Triton's allocator, which is set per thread."""
    if getattr(_THREAD, "allocator", False):
        return
    import torch
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    _THREAD.allocator = True


class TritonKernel(Kernel):
    """A piece's generated kernels. On CUDA each launch has a `KernelSpec` (compiler.py) that the
    build compiles ahead of the first launch (in parallel, `compile_specs`); `bind` launches the
    binaries natively (bound.py). `run` is the self-contained path (tuning, tests): Triton's JIT."""

    def __init__(
        self, piece: Piece, config: EngineConfig, generated: Generated, interpret: bool, device: Device | None = None
    ) -> None:
        super().__init__(piece, config)
        self.generated = generated
        self.interpret = interpret
        self.device = device
        self.device_index = device.index if device is not None else 0
        self.module = load_module(generated.source, interpret=interpret)
        self.scratch_bytes = generated.scratch_bytes
        self._needs_allocator = "needs_allocator" in generated.notes and not interpret
        self._specs: list[compiler.KernelSpec | None] | None = None

    @functools.cached_property
    def launchers(self) -> list[Launcher]:
        """Triton's JIT launchers of the launches (the interpreter's and `run`'s; a bound plan on CUDA
        launches the compiled binaries natively and never asks: a dynamic plan's copy of the kernel at
        each new shape makes none)."""
        return self._launchers(self.generated)

    def grid(self, i: int) -> tuple[int, int, int]:
        """Launch i's grid, three-dimensional."""
        return grid3(self.generated.launches[i].grid)

    def _launchers(self, generated: Generated) -> list[Launcher]:
        return [
            Launcher(
                getattr(self.module, l.kernel),
                l.grid,
                dict(l.meta),
                direct=not self.interpret,
                device_index=self.device_index,
            )
            for l in generated.launches
        ]

    def at(self, piece: Piece, env: Mapping[str, int]) -> TritonKernel:
        """This kernel (its `generated` taking every size at run time: `Generated.sized`) for `piece`,
        the same piece at another shape of its bucket (`env`): the same module, compile specs and
        binaries; only the launches' grids and size arguments are that shape's."""
        if self._specs is None and not self.interpret and self.device is not None:
            self.spec(0)  # (made once, here: every shape's copy shares the bucket kernel's specs)
        other = object.__new__(TritonKernel)
        for name, value in dict(vars(self)).items():  # (set one by one: no dict object of its own per shape)
            if name != "launchers":  # (this shape's, made if asked)
                _SET(other, name, value)
        other.piece = piece
        other.generated = self.generated.at(env)
        other.repointed = True
        return other

    def source(self) -> str:
        return self.generated.source

    def source_digest(self) -> str:
        """The source's hash up to its kernels' parameter and local names: a build gives a piece identical to an
        earlier one (a model's repeated layer, a view copied twice) that piece's text, its parameters named after
        the other's tensors (`_generated_like`), which a plan file's loading regenerates under its own; and up to
        the launch overlap's statements (a plan saved with OPGRAPH_LAUNCH_OVERLAP on loads with it off, and back:
        its binaries are matched by their own source, so the waits and the launches agree either way)."""
        return hashlib.sha256(compiler.alpha_renamed(without_overlap(self.generated.source)).encode()).hexdigest()

    # -- ahead-of-time compilation ----------------------------------------------------------------
    def _arg_type(self, arg: Arg, gluon: bool = False) -> str:
        if arg.kind == "buf":
            return compiler.pointer_type(self.piece.tensor(arg.uid).data_type)
        if arg.kind == "scalar":  # a Python float, rounded to its declared type by the binding, or an int64
            return "i64" if arg.dtype == "int64" else "fp64"  # (rewrite.typed_scalars)
        if arg.kind == "scratch":
            return compiler.scratch_type(arg.dtype)
        if arg.kind == "desc":
            element = compiler.pointer_type(self.piece.tensor(arg.uid).data_type)[1:]
            return tma_desc.signature_type(element, arg.block, gluon)
        if arg.kind == "size":
            return "i64" if arg.dtype == "int64" else "i32"
        return "*i64"  # the address table

    def spec(self, i: int) -> compiler.KernelSpec | None:
        """Launch i's compile spec (CUDA only; None where Triton's JIT must decide)."""
        if self.interpret or self.device is None:
            return None
        if self._specs is None:
            path, name = str(module_file(self.generated.source)), module_name(self.generated.source, False)
            target = compiler.target_of(self.device.capability)
            canonical = compiler.canonical_digest(self.generated.source)
            self._specs = [
                compiler.make_spec(
                    getattr(self.module, l.kernel),
                    path,
                    name,
                    l.kernel,
                    [self._arg_type(a, self.gluon(li)) for a in l.args],
                    dict(l.meta),
                    target,
                    canonical,
                    [
                        i
                        for i, a in enumerate(l.args)
                        if a.kind == "size" and a.expr is not None and divides(16, a.expr)
                    ],
                )
                for li, l in enumerate(self.generated.launches)
            ]
        return self._specs[i]

    def compile_specs(self) -> list[tuple[compiler.KernelSpec, Any]]:
        if self.interpret or self.device is None:
            return []
        out = []
        for i, l in enumerate(self.generated.launches):
            spec = self.spec(i)
            if spec is not None:
                out.append((spec, getattr(self.module, l.kernel)))
        return out

    def binary(self, i: int) -> compiler.KernelBinary | None:
        """Launch i's binary: from the registry, else compiled now in a worker process (a lazy build's
        first bind: ExecutionError, not a crash, when the compiler fails)."""
        spec = self.spec(i)
        if spec is None:
            return None
        try:
            return compiler.registered(spec) or compiler.compile_here(
                spec, getattr(self.module, self.generated.launches[i].kernel), isolated=True
            )
        except ExecutionError as err:
            raise ExecutionError(err.detail, op=self.piece.nodes[0].label(), rule=err.rule, hint=err.hint) from err

    def global_scratch_bytes(self) -> dict[int, int]:
        """The per-program scratch a compiled launch asks for (device-side TMA descriptors), for its
        whole grid, plus the alignment it wants: bound.py's native launches take it from here."""
        if self.interpret or self.device is None:
            return {}
        out = {}
        for i in range(len(self.generated.launches)):
            binary = self.binary(i)
            need, _ = self.global_scratch(i, binary) if binary is not None else (0, 1)
            if need:
                out[i] = need
        return out

    def global_scratch(self, i: int, binary: Any) -> tuple[int, int]:
        """(bytes, alignment) of the global scratch launch i's compiled `binary` takes for its whole grid
        (0 bytes: none)."""
        per_program = int(binary.meta("global_scratch_size") or 0)
        align = int(binary.meta("global_scratch_align") or 1)
        if not per_program:
            return 0, align
        gx, gy, gz = self.grid(i)
        return gx * gy * gz * per_program + align, align

    def artifacts(self) -> list[Any]:
        out = []
        for i in range(len(self.generated.launches)):
            spec = self.spec(i)
            binary = compiler.registered(spec) if spec is not None else None
            if binary is not None:
                out.append(binary.artifact())
        return out

    # -- running ----------------------------------------------------------------------------------
    def bind(self, binding: Binding, scratch: Any) -> BaseLauncher:
        if self.interpret:
            return InterpretedLauncher(self, binding, scratch)
        if self._needs_allocator:
            _ensure_allocator()
        return TritonLauncher(self, binding, scratch)

    def gluon(self, i: int) -> bool:
        """Whether launch i's kernel is Gluon's (a WS=1 matmul: its descriptors name their layouts)."""
        return not self.interpret and _is_gluon(getattr(self.module, self.generated.launches[i].kernel))

    def _arg(self, arg: Arg, buffers: Mapping[int, Any], scratch: Any, gluon: bool = False) -> Any:
        if arg.kind == "buf":
            return _as_torch(buffers[arg.uid])
        if arg.kind == "scalar":
            return host_scalar(arg, buffers[arg.uid])
        if arg.kind == "scratch":
            import torch

            return _as_torch(scratch)[arg.offset :].view(getattr(torch, arg.dtype))
        if arg.kind == "table":
            return buffers[TABLE_KEY]
        if arg.kind == "size":
            return arg.value
        if arg.kind == "desc":
            return tma_desc.descriptor_object(arg, _as_torch(buffers[arg.uid]), gluon)
        raise ValueError(arg.kind)

    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None:
        if self._needs_allocator:
            _ensure_allocator()
        # the interpreter evaluates masked-off lanes too (e.g. 0/0 past the end): NumPy's warnings
        # about them are noise
        with np.errstate(all="ignore"), interpreting_here():
            for i, (launch, launcher) in enumerate(zip(self.generated.launches, self.launchers)):
                launcher([self._arg(a, buffers, scratch, self.gluon(i)) for a in launch.args], stream)


def refusal_text(piece: Piece, refusals: list[tuple[Template, str]]) -> str:
    """Why no template runs `piece`, the main reason first: the templates built around the piece's
    last op (the one that did not join), then those built around its other ops; templates for ops
    the piece does not hold are only named."""
    last = piece.nodes[-1].kind if piece.nodes else ""
    kinds = {n.kind for n in piece.nodes}

    def rank(t: Template) -> int:
        if not t.main_kinds or last in t.main_kinds:
            return 0
        return 1 if kinds & set(t.main_kinds) else 2

    ordered = sorted(refusals, key=lambda r: rank(r[0]))  # stable: template priority within a rank
    text = "; ".join(f"{t.name}: {why}" for t, why in ordered if rank(t) < 2)
    absent = [t.name for t, _ in ordered if rank(t) == 2]
    if absent:
        text += ("; " if text else "") + f"not applicable (no op of theirs here): {', '.join(absent)}"
    return text


class _Matches:
    """One build's matches, by piece identity and device: a piece's analysis made by `supports` serves
    `configs` and `compile` (the partitioner asks about many pieces: the oldest are dropped). It lives
    for one build (TritonEngine.session), so no piece, and no graph or plan behind it, outlives it here."""

    SIZE = 256

    def __init__(self) -> None:
        self._found: OrderedDict[tuple[int, Device], tuple[Piece, Match[Any] | None, str]] = OrderedDict()
        # a config's kernels as its template generated them for the first piece of a structure (a model's
        # identical layers), by `generated_key`
        self.generated: dict[tuple[Any, ...], tuple[Piece, Generated]] = {}

    def get(self, piece: Piece, device: Device) -> tuple[Match[Any] | None, str] | None:
        hit = self._found.get((id(piece), device))
        if hit is None or hit[0] is not piece:
            return None
        self._found.move_to_end((id(piece), device))
        return hit[1], hit[2]

    def put(self, piece: Piece, device: Device, match: Match[Any] | None, why: str) -> None:
        self._found[(id(piece), device)] = (piece, match, why)
        while len(self._found) > self.SIZE:
            self._found.popitem(last=False)

    @staticmethod
    def generated_key(piece: Piece, config: EngineConfig, device: Device) -> tuple[Any, ...]:
        """What a piece's generated kernels are shared by: its graph, its structure (Piece.structure_key),
        the config's knobs and the device."""
        return (id(piece.graph), piece.structure_key(), config.knobs, device)


# the matches of the build running in this thread (or task); None outside a build
_SESSION: ContextVar[_Matches | None] = ContextVar("opgraph_triton_matches", default=None)


# the cast instructions generated kernels use (casts.py), by type: (only where a kernel writes it, the compute
# capability it needs, what needs it, the instruction)
_CAST_INSTRUCTIONS = (
    (DataType.BFLOAT16, False, (8, 0), "bfloat16 in generated kernels needs", "cvt.rn.bf16.f32"),
    (DataType.FP8_E4M3, True, (8, 9), "E4M3 results in generated kernels need", "cvt.rn.satfinite.e4m3x2.f32"),
)


def _missing_cast_instruction(piece: Piece, device: Device) -> str | None:
    """Why a GPU cannot run the piece's generated kernels for want of a cast instruction (None: it can)."""
    cap = device.capability
    if not device.is_cuda or cap is None:
        return None
    for dtype, written, least, what, instruction in _CAST_INSTRUCTIONS:
        uids = (u for n in piece.nodes for u in (n.output_uids() if written else (*n.input_uids(), *n.output_uids())))
        if cap < least and any(isinstance(u, int) and piece.tensor(u).data_type is dtype for u in uids):
            return (
                f"{what} a GPU of compute capability {least[0]}.{least[1]} or newer (the {instruction} "
                f"instruction); this one is {cap[0]}.{cap[1]}: another engine (PyTorch) runs it"
            )
    return None


class TritonEngine(Engine):
    name = "triton"

    @contextmanager
    def session(self) -> Iterator[None]:
        if _SESSION.get() is not None:  # a build within a build shares the outer one's matches
            yield
            return
        token = _SESSION.set(_Matches())
        try:
            yield
        finally:
            _SESSION.reset(token)

    def available(self, device: Device) -> Support:
        if not _triton_installed():
            return Support.no("Triton and PyTorch are not installed (pip install 'opgraph[triton,torch]')")
        if device.is_cuda and interpreting():
            return Support.no(
                "Triton was imported with TRITON_INTERPRET=1, so it cannot compile for the GPU in "
                "this process (unset the variable, or run on device='cpu')"
            )
        return Support.yes()

    def match(self, piece: Piece, device: Device) -> tuple[Match[Any] | None, str]:
        """The first template's match of `piece` (by priority), or None and why no template runs it."""
        matches = _SESSION.get()
        found = matches.get(piece, device) if matches is not None else None
        if found is None:
            found = self._match(piece, device)
            if matches is not None:
                matches.put(piece, device, *found)
        return found

    def _match(self, piece: Piece, device: Device) -> tuple[Match[Any] | None, str]:
        why = _missing_cast_instruction(piece, device)
        if why is not None:
            return None, why
        refusals = []
        for t in TEMPLATES:
            verdict = t.match(piece, device)
            if isinstance(verdict, Match):
                return verdict, ""
            refusals.append((t, verdict.reason))
        return None, refusal_text(piece, refusals)

    def supports(self, piece: Piece, device: Device) -> Support:
        avail = self.available(device)
        if not avail.ok:
            return avail
        match, why = self.match(piece, device)
        return Support.yes() if match is not None else Support.no(why)

    def facts(self, piece: Piece, device: Device) -> EngineFacts:
        """The estimate of the heuristic's pick (mode A's first config), which the build's policy weighs
        a vendor library's against."""
        if not device.is_cuda:
            return EngineFacts()
        configs = self.configs(piece, device, HeurMode.A)
        return EngineFacts(configs[0].estimate_us if configs else None)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        match, _ = self.match(piece, device)
        if match is None:
            return []
        candidates = match.candidates()
        notes = {k: frozenset(match.notes(k)) for k in candidates}
        if mode is not HeurMode.B:
            # the heuristic's pick (FALLBACK: the broadest, last), then the best config of every other
            # numerical class (full-fp32 "ieee" next to tf32), so that a build filtering notes out
            # (deselect_numeric_notes=[DOWN_CONVERT_INPUTS]) still finds a config in these modes; in
            # mode A also the candidates whose knobs the build's policy chooses (Knobs.CHOICES)
            policy = [k for k in candidates if k.chosen_by_policy()]
            plain = [k for k in candidates if not k.chosen_by_policy()]
            # (FALLBACK: the broadest first, never a variant offered for tuning until measured)
            ordered = sorted(plain[::-1], key=lambda k: k.unmeasured()) if mode is HeurMode.FALLBACK else plain
            picked: dict[frozenset[NumericalNote], Knobs] = {}
            for k in ordered:
                picked.setdefault(notes[k], k)
            candidates = list(picked.values()) + (policy if mode is HeurMode.A else [])
        return self._configs(match, candidates, device, f"{mode.name} heuristic", notes)

    def _configs(
        self,
        match: Match[Any],
        candidates: Iterable[Knobs],
        device: Device,
        why: str,
        notes: Mapping[Knobs, frozenset[NumericalNote]] | None = None,
    ) -> list[EngineConfig]:
        """EngineConfigs of a match's knob sets (`notes`: their numerical notes where already known)."""
        behavior = {BehaviorNote.RUNTIME_COMPILATION, BehaviorNote.DEVICE_SCALARS}
        if device.is_cuda:
            behavior |= {BehaviorNote.CUDA_GRAPH_CAPTURABLE, BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API}
        else:
            behavior |= {BehaviorNote.INTERPRETED, BehaviorNote.HOST_EXECUTION}
        name = match.template.name
        return [
            EngineConfig(
                "triton",
                (("template", name), *k.pairs()),
                numerical_notes=notes[k] if notes is not None else frozenset(match.notes(k)),
                behavior_notes=frozenset(behavior),
                estimate_us=estimate(match, k),
                why=f"{name} template, {why}",
            )
            for k in candidates
        ]

    def configs_at(self, piece: Piece, device: Device, env: Mapping[str, int]) -> list[EngineConfig]:
        """The bucket piece's template ranking its configs at the bucket's shape `env` (Match.focused),
        without the broadest fallback; estimates only on CUDA."""
        if not device.is_cuda:
            return []
        match, _ = self.match(piece, device)
        focused = match.focused(env) if match is not None else None
        if focused is None:
            return []
        where = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
        return self._configs(focused, focused.candidates()[:-1], device, f"ranked at {where} of its bucket")

    def estimator(
        self, piece: Piece, config: EngineConfig, device: Device
    ) -> Callable[[Mapping[str, int]], float | None] | None:
        """The bucket piece's match (analysed once, here) estimating `config` at a shape of the bucket, where
        its template has that notion (Match.focused) and the config's kernel serves the whole bucket."""
        if not device.is_cuda or config.engine != self.name:
            return None
        match, _ = self.match(piece, device)
        if match is None or match.template.name != config.knob("template"):
            return None
        knobs = match.knobs({k: v for k, v in config.knobs if k != "template"})
        if match.estimate_at(knobs, piece.graph.origin.env if piece.graph.origin else {}) is None:
            return None
        return functools.partial(match.estimate_at, knobs)

    def kernel_at(self, kernel: Kernel, piece: Piece, device: Device) -> Kernel | None:
        """A kernel taking its sizes at run time serves the piece at every shape of its bucket (its
        template decided over the bucket); any other is generated again at the piece's shape with the
        same knobs, where the template still runs the piece and accepts them there (Match.accepts)."""
        origin = piece.graph.origin
        if isinstance(kernel, TritonKernel) and kernel.generated.sized and origin is not None:
            return kernel.at(piece, origin.env)
        config = kernel.config
        match, _ = self.match(piece, device)
        if match is None or match.template.name != config.knob("template"):
            return None
        knobs = match.knobs({k: v for k, v in config.knobs if k != "template"})
        if not match.accepts(knobs) or match.notes(knobs) != config.numerical_notes:
            return None
        return self.compile(piece, config, device)

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        return TritonKernel(
            piece, config, self.generated(piece, config, device), interpret=not device.is_cuda, device=device
        )

    def generated(self, piece: Piece, config: EngineConfig, device: Device) -> Generated:
        """The kernels of `config` as compile() loads them: source, launches and scratch, nothing run."""
        knobs = dict(config.knobs)
        name = knobs.pop("template", None)
        template = TEMPLATE_BY_NAME.get(name)
        if template is None:
            raise AttributeValueError(
                f"triton config {config} names no template of this Triton engine ({name!r})",
                op=piece.nodes[0].label(),
                rule="triton.template",
                hint=f"templates: {', '.join(sorted(TEMPLATE_BY_NAME))}; take configs from engine_configs() "
                "or from a plan this version built",
            )
        raw = self._generated_like(piece, config, device)
        if raw is None:
            match, _ = self.match(piece, device)
            if match is None or match.template is not template:  # (a config read from a plan file: matched here)
                match = template.matched(piece, device)
            raw = match.generate(match.knobs(knobs))
            if (matches := _SESSION.get()) is not None:
                matches.generated[matches.generated_key(piece, config, device)] = (piece, raw)
        generated = fp8_fill(raw, {u: t.data_type for u, t in piece.graph.tensors.items()})
        generated = typed_scalars(make_indirect(generated, table_slots(piece.graph)))
        overlap = overlap_mode(device)
        return generated if overlap == "off" else overlapped(generated, gluon=overlap == "all")

    @staticmethod
    def _generated_like(piece: Piece, config: EngineConfig, device: Device) -> Generated | None:
        """The kernels this build generated with `config` for a piece identical to `piece` (the same
        structure in the same graph: a model's repeated layer), their arguments moved to `piece`'s
        tensors: the same source (the parameters' names are the other piece's; launches pass arguments
        by position). None where no such piece was generated in this build."""
        matches = _SESSION.get()
        hit = matches.generated.get(matches.generated_key(piece, config, device)) if matches else None
        if hit is None or hit[0].graph is not piece.graph:
            return None
        first, raw = hit
        pairs = dict(zip(first.uid_order(), piece.uid_order()))
        launches = []
        for launch in raw.launches:
            args = []
            for a in launch.args:
                if a.kind in (ArgKind.BUF, ArgKind.DESC, ArgKind.SCALAR):
                    if a.uid not in pairs:
                        return None
                    a = evolve(a, uid=pairs[a.uid])
                args.append(a)
            launches.append(evolve(launch, args=tuple(args)))
        moved = evolve(raw, launches=tuple(launches))
        if raw.sized:  # (the same expressions of the dims: one function evaluates both at every shape)
            moved.__dict__["shape_function"] = raw.shape_function
        return moved

    # templates whose program that reads an element of a piece input (in its elementwise body, its
    # GEMM epilogue, or a per-channel stats slot) is the one that writes the aligned output element;
    # the multi-launch row/reduction templates may read an input again after an earlier launch wrote
    INPLACE_TEMPLATES = frozenset(
        {"pointwise", "conv_fprop", "conv_dgrad", "conv_wgrad", "depthwise", "matmul", "norm_stats"}
    )

    def inplace_safe(self, config: EngineConfig) -> bool:
        return config.knob("template") in self.INPLACE_TEMPLATES

    def compiler(self) -> Compiler:
        return compiler  # the module: compile_all, compile_here (engines.base.Compiler)


register_engine(TritonEngine())
__all__ = ["TritonEngine", "TritonKernel", "TEMPLATES"]
