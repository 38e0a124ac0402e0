"""The template protocol: how a generated kernel is described to the Triton engine. A new template (a
module of this package exposing `TEMPLATE`) is written against it, in the order the engine uses it:

1. `Template.match(piece, device)` analyses the piece once: a typed refusal (`Support.no(reason, node)`,
   the engine explains a piece nobody runs from these) or a `Match` holding the analysis (the template's
   own: a GemmPiece, a pooling geometry, an attention spec). Templates are tried by descending
   `priority`; the first match runs the piece. The engine keeps the match from `supports` / `configs`
   to `compile` (by piece identity); a config read from a plan file is matched again.
2. `Match.candidates()`: the template's knob sets (one frozen dataclass per family, knobs.py), the
   heuristic's choice first, the broadest (HeurMode.FALLBACK's pick) last. A knob set is stored as
   `pairs()` after ("template", name) in EngineConfig.knobs; `Match.knobs(stored)` reads it back.
3. `Match.notes(knobs)`: numerical notes of a config (TF32 products, tensor cores); none by default.
4. `Match.estimate(knobs)`: estimated µs on the match's device, or None for the engine's generic
   bytes-and-math estimate (made with `Match.launches(knobs)` launches).
5. `Match.generate(knobs) -> Generated`: the module source and its launches (kernel name, grid,
   arguments as `Arg`s: bound buffers, pass-by-value scalars, typed slices of the step's scratch, the
   address table, host-side TMA descriptors of bound buffers), the scratch bytes and notes. `Params` collects a kernel's parameters and arguments.

Ways of running a config that are not the plain kernel (an image prologue run as its own pass, merged
filter taps, depthwise row strips) are strategy objects the match selects by the config's knobs
(gemm/template.py says how); the engine sees one `generate`. The GEMM-class templates share their
analysis, tiling, epilogue and generation in gemm/ (`TileTemplate` / `TileMatch`, with named hooks)."""

from __future__ import annotations

import enum
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.errors import AttributeValueError
from ....core.evolve import evolve
from ....core.piece import Piece
from ....core.symbolic import SymInt, evaluate, free_symbols, lambdify
from ....core.tensor import TensorDesc
from ..expr import custom_imports, helpers_for
from ..gluon_prelude import GLUON_PRELUDE
from ..knobs import Knobs

K = TypeVar("K", bound=Knobs)


_PARAM = re.compile(r"([ps])(\d+)")


class ArgKind(str, enum.Enum):
    """What fills a kernel argument at launch."""

    BUF = "buf"  # a bound buffer's address (uid)
    SCALAR = "scalar"  # a pass-by-value scalar's value (uid; dtype "int64": an int64 argument, else float64)
    SCRATCH = "scratch"  # a typed slice of the step's scratch memory (byte offset, dtype name)
    TABLE = "table"  # the plan's address table of by-reference tensors
    DESC = "desc"  # a host-side TMA tensor descriptor of a bound buffer (engines/triton/tma_desc.py)
    SIZE = "size"  # a size of a dynamic plan's shape (`value`; dtype int32 or int64: engines/triton/sizes.py)


@dataclass(frozen=True)
class Arg:
    """A runtime kernel argument (see ArgKind)."""

    kind: ArgKind
    uid: int = -1
    offset: int = 0  # SCRATCH: bytes into the scratch; DESC: elements into the buffer
    dtype: str = "float32"
    shape: tuple[int, ...] = ()  # DESC: the addressed tensor's dims, outermost first
    strides: tuple[int, ...] = ()  # DESC: its strides in elements (the last one 1)
    block: tuple[int, ...] = ()  # DESC: the block one load or store moves
    value: int = 0  # SIZE: the size's value at the plan's shape
    expr: SymInt | None = None  # SIZE: the size as an expression of the dynamic dims (sizes.py)
    # DESC of a bucket kernel: (shape, strides, offset) as expressions of the dynamic dims; `shape`,
    # `strides` and `offset` hold their values at the plan's shape (`at_shape`)
    desc_expr: tuple[tuple[SymInt, ...], tuple[SymInt, ...], SymInt] | None = None

    def at_shape(self, env: Mapping[str, int]) -> Arg:
        """This argument at a shape of its bucket (`env`): a size's value, a descriptor's shape, strides
        and offset (a view's), from their expressions; anything else as it is."""
        exprs = self.shape_exprs()
        return self.with_values([evaluate(v, env) for v in exprs]) if exprs else self

    def shape_exprs(self) -> tuple[SymInt, ...]:
        """What this argument takes from the shape, in `with_values`' order: a size's expression; a
        descriptor's shape, strides and offset where any is one; else nothing."""
        if self.expr is not None:
            return (self.expr,)
        if self.kind == ArgKind.DESC and (
            self.desc_expr is not None or not all(isinstance(v, int) for v in (*self.shape, *self.strides, self.offset))
        ):
            shape, strides, offset = self.desc_expr or (self.shape, self.strides, self.offset)
            return (*shape, *strides, offset)
        return ()

    def with_values(self, values: Sequence[int]) -> Arg:
        """This argument with the values of its `shape_exprs` at a shape."""
        if self.expr is not None:
            key = (self.expr, self.dtype, self.kind, self.uid, self.offset, values[0])
            found = _SIZE_ARGS.get(key)
            if found is None:
                if len(_SIZE_ARGS) >= 4096:
                    _SIZE_ARGS.clear()
                found = _SIZE_ARGS[key] = evolve(self, value=values[0])
            return found
        shape, strides, offset = self.desc_expr or (self.shape, self.strides, self.offset)
        n = len(shape)
        return evolve(
            self,
            shape=tuple(values[:n]),
            strides=tuple(values[n : 2 * n]),
            offset=values[2 * n],
            desc_expr=(shape, strides, offset),
        )


# a size argument at a value, shared by every launch and shape that passes it (frozen: a dynamic plan's
# shapes pass a handful of distinct sizes in hundreds of launches)
_SIZE_ARGS: dict[tuple[Any, ...], Arg] = {}


@dataclass(frozen=True)
class Launch:
    """One launch of a generated module's kernel: its name, grid, arguments in parameter order, and meta
    (constexprs, num_warps / num_stages)."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple[Arg, ...]
    meta: tuple[tuple[str, Any], ...] = ()  # constexprs and num_warps / num_stages
    # a kernel taking its sizes at run time (sizes.py): the grid as expressions of the dynamic dims
    grid_expr: tuple[SymInt, ...] | None = None

    def shape_exprs(self) -> tuple[SymInt, ...]:
        """What the launch takes from the shape, in `with_values`' order: its grid, then its arguments'."""
        assert self.grid_expr is not None
        return (*self.grid_expr, *(v for a in self.args for v in a.shape_exprs()))

    def with_values(self, values: Sequence[int], counts: Sequence[int]) -> Launch:
        """The launch at another shape of its bucket (Generated.at): the values of its `shape_exprs` there,
        `counts` how many of them each argument takes."""
        assert self.grid_expr is not None
        at, args = len(self.grid_expr), []
        for a, n in zip(self.args, counts):
            args.append(a.with_values(values[at : at + n]) if n else a)
            at += n
        return evolve(self, grid=tuple(values[: len(self.grid_expr)]), args=tuple(args))


@dataclass(frozen=True)
class Generated:
    """A config's kernels: the module source, its launches in order, the scratch bytes they share and
    notes for the engine ("needs_allocator": device-side tensor descriptors). `bucket_scratch`: the
    scratch is laid out for the bucket's largest shape (the same bytes and offsets at every shape of it,
    the kernels indexing it by run-time sizes), so it does not keep the kernels from being `sized`."""

    source: str
    launches: tuple[Launch, ...]
    scratch_bytes: int = 0
    notes: frozenset[str] = field(default_factory=frozenset)
    bucket_scratch: bool = False

    @property
    def sized(self) -> bool:
        """Whether the kernels take every size at run time (a dynamic plan's bucket kernel, sizes.py):
        one source for every shape of the bucket, whose launches `at` gives per shape."""
        return (
            bool(self.launches)
            and (not self.scratch_bytes or self.bucket_scratch)
            and all(
                l.grid_expr is not None and all(a.expr is not None for a in l.args if a.kind == ArgKind.SIZE)
                for l in self.launches
            )
        )

    def at(self, env: Mapping[str, int]) -> Generated:
        """The kernels at another shape of their bucket (`env`: the dims' values; `sized` ones only):
        the same source, the launches' grids and size arguments evaluated there, all by one call of
        `shape_function` (a dynamic plan does this for every step at every new shape)."""
        names, values_of, counts = self.shape_function
        values = values_of(*(env[n] for n in names))
        launches, at = [], 0
        for launch, (n, per_arg) in zip(self.launches, counts):
            launches.append(launch.with_values(values[at : at + n], per_arg))
            at += n
        return evolve(self, launches=tuple(launches))

    @cached_property
    def shape_function(
        self,
    ) -> tuple[tuple[str, ...], Callable[..., tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], ...]]:
        """What `at` evaluates, made once for a bucket kernel (its copies at every shape share it): the
        dims' names, one function of their values giving every launch's `shape_exprs` one after the
        other, and how many each launch takes (and each of its arguments)."""
        per_launch = [l.shape_exprs() for l in self.launches]
        flat = [v for exprs in per_launch for v in exprs]
        dims = sorted({d for v in flat for d in free_symbols(v)}, key=lambda d: d.name)
        counts = tuple(
            (len(exprs), tuple(len(a.shape_exprs()) for a in l.args)) for l, exprs in zip(self.launches, per_launch)
        )
        return tuple(d.name for d in dims), lambdify(flat, dims), counts


class Match(ABC, Generic[K]):
    """A template's analysis of one piece on one device, and everything the engine asks of it (see the
    module docstring). It reads as a `Support` that says yes (`ok`, `reason`), so code that only asks
    whether a template runs a piece keeps asking `match(...).ok`."""

    ok: ClassVar[bool] = True
    reason: ClassVar[str] = ""

    def __init__(self, template: Template, piece: Piece, device: Device) -> None:
        self.template, self.piece, self.device = template, piece, device

    def __bool__(self) -> bool:
        return True

    @property
    def interpret(self) -> bool:
        """Whether the kernels run in Triton's interpreter (the CPU)."""
        return not self.device.is_cuda

    @abstractmethod
    def candidates(self) -> list[K]:
        """Knob sets, the heuristic's choice first, the broadest last."""

    def accepts(self, knobs: K) -> bool:
        """Whether a knob set runs this piece: one chosen for the piece at another shape of a dynamic
        plan's bucket (TritonEngine.kernel_at). By default, whether it is among the candidates."""
        return knobs in self.candidates()

    def knobs(self, stored: Mapping[str, Any]) -> K:
        """The knob set of a stored config (its ("template", name) pair left out)."""
        return self.template.knob_class.parse(stored, self.template.name)  # type: ignore[return-value]

    def notes(self, knobs: K) -> frozenset[NumericalNote]:
        """The numerical notes of a config (tensor cores, TF32, split reductions): none by default."""
        return frozenset()

    def estimate(self, knobs: K) -> float | None:
        """Estimated µs of a config; None: the engine's generic bytes-and-math estimate."""
        return None

    def launches(self, knobs: K) -> int:
        """Launches a config makes, for the generic estimate."""
        return 1

    def focused(self, env: Mapping[str, int]) -> Match[K] | None:
        """For a piece of a dynamic plan's bucket: this match ranking and estimating its configs at the shape
        `env` of the bucket (the dynamic dims' values), only those whose one kernel serves every shape of
        the bucket (a bucket's tile variants: build/tile_variants.py). None (the default): no such choice."""
        return None

    def estimate_at(self, knobs: K, env: Mapping[str, int]) -> float | None:
        """A config's estimate at the shape `env` of the piece's bucket (`focused`); None where there is none.
        Asked at every new shape of a dynamic plan: templates make it cheaper than `focused`."""
        focused = self.focused(env)
        return None if focused is None else focused.estimate(knobs)

    @abstractmethod
    def generate(self, knobs: K) -> Generated: ...


class Template(ABC):
    """A kernel template: its name (stored in configs), priority (higher is tried first), the op kinds a
    piece must hold for it to apply (explanations of why a piece was not fused list the reasons of the
    templates that apply first), its knob family, and `match`."""

    name: str
    priority: int = 0
    main_kinds: tuple[str, ...] = ()
    knob_class: type[Knobs] = Knobs

    @abstractmethod
    def match(self, piece: Piece, device: Device) -> Support | Match[Any]: ...

    # -- conveniences for tests and tools: one call, one match (the engine keeps its matches instead) --
    def matched(self, piece: Piece, device: Device) -> Match[Any]:
        """The match of a piece this template runs; a typed error naming the reason where it does not."""
        found = self.match(piece, device)
        if not isinstance(found, Match):
            raise AttributeValueError(
                f"the {self.name} template cannot run this piece: {found.reason}",
                op=found.node.label() if found.node else None,
                rule="triton.template.match",
                hint="ask the engine which template matches",
            )
        return found

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        """The match's candidates as stored knob dicts."""
        return [dict(k.pairs()) for k in self.matched(piece, device).candidates()]

    def generate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> Generated:
        m = self.matched(piece, device)
        return m.generate(m.knobs(knobs))

    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        m = self.matched(piece, device)
        return m.notes(m.knobs(knobs))

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        m = self.matched(piece, device)
        return m.estimate(m.knobs(knobs))


class Params:
    """The runtime parameters of one generated kernel and the launch arguments that fill them, in
    first-use order."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.args: list[Arg] = []

    def add(self, name: str, arg: Arg) -> str:
        """Parameter `name`, filled by `arg` (once: a name used again is the same parameter)."""
        if name not in self.names:
            self.names.append(name)
            self.args.append(arg)
        return name

    def buf(self, uid: int) -> str:
        return self.add(f"p{uid}", Arg(ArgKind.BUF, uid))

    def scalar(self, uid: int, dtype: str = "float32") -> str:
        """Pass-by-value scalar `uid`: a float64 kernel argument, or with dtype "int64" an int64 one (a
        Philox seed: exact over its whole range)."""
        return self.add(f"s{uid}", Arg(ArgKind.SCALAR, uid, dtype=dtype))

    def scratch(self, name: str, offset: int, dtype: str = "float32") -> str:
        return self.add(name, Arg(ArgKind.SCRATCH, offset=offset, dtype=dtype))

    def desc(
        self,
        name: str,
        uid: int,
        offset: int,
        shape: Sequence[SymInt],
        strides: Sequence[SymInt],
        block: Sequence[int],
    ) -> str:
        """A host-side tensor descriptor of buffer `uid` from element `offset` (a kernel argument that the
        launcher encodes at bind: tma_desc.py); a bucket kernel's shape and strides may be expressions
        of the dynamic dims (the generator makes them values with `Arg.at_shape`)."""
        arg = Arg(ArgKind.DESC, uid, offset, shape=tuple(shape), strides=tuple(strides), block=tuple(block))  # type: ignore[arg-type]
        return self.add(name, arg)

    def named(self, name: str, scratch: Mapping[str, Arg] | None = None, dtype: str = "float32") -> str:
        """A parameter by its name: p{uid} a buffer, s{uid} a pass-by-value scalar (of `dtype`: see
        `scalar`), or one of `scratch`."""
        if scratch is not None and name in scratch:
            return self.add(name, scratch[name])
        found = _PARAM.fullmatch(name)
        if found is None:
            raise ValueError(f"kernel parameter {name!r}: not p<uid>, s<uid> or a scratch buffer")
        return self.buf(int(found[2])) if found[1] == "p" else self.scalar(int(found[2]), dtype)

    def signature(self, name: str, constexprs: Sequence[str] = ()) -> str:
        return f"def {name}({', '.join([*self.names, *(f'{c}: tl.constexpr' for c in constexprs)])}):"

    def source(self, name: str, constexprs: Sequence[str], body: list[str]) -> str:
        return f"{self.signature(name, constexprs)}\n{indent(body)}\n"


def host_scalar(arg: Arg, value: Any) -> int | float:
    """The value of a SCALAR argument as its kernel parameter takes it: an int for an int64 one (never
    through a float), else a float."""
    return int(value) if arg.dtype == "int64" else float(value)


def external_params(piece: Piece, uids: Sequence[int]) -> tuple[list[str], list[Arg]]:
    """Kernel parameters and launch arguments of tensors `uids`: s{uid} for a pass-by-value scalar,
    p{uid} for a buffer."""
    params, args = [], []
    for u in uids:
        if piece.tensor(u).is_pass_by_value:
            params.append(f"s{u}")
            args.append(Arg(ArgKind.SCALAR, u))
        else:
            params.append(f"p{u}")
            args.append(Arg(ArgKind.BUF, u))
    return params, args


INT32_LIMIT = 2**31 - 1


def extent(desc: TensorDesc) -> int:
    """One past the largest element offset of `desc` (its strides' reach)."""
    return 1 + sum((d - 1) * s for d, s in zip(desc.dim, desc.stride))


def offsets_need_int64(descs: Iterable[TensorDesc], lanes: int | None = None) -> bool:
    """Whether offsets into `descs` can pass int32; with `lanes`, a flat index walking a tensor's
    elements that many lanes at a time (its last program runs up to numel + lanes) counts too."""
    return any(extent(t) > INT32_LIMIT or (lanes is not None and t.numel + lanes > INT32_LIMIT) for t in descs)


def program_id(axis: int = 0, big: bool = False) -> str:
    """The program's index along grid axis `axis`, widened to int64 where offsets need it."""
    return f"tl.program_id({axis}).to(tl.int64)" if big else f"tl.program_id({axis})"


T = TypeVar("T")


def unique(configs: Iterable[T]) -> list[T]:
    """`configs` (knob sets) without repeats, in order (the first of equal ones kept)."""
    return list(dict.fromkeys(configs))


def module_source(*functions: str, gluon: bool = False) -> str:
    """A generated module: imports (and those of the custom ops' Triton functions it calls), the
    helpers they call, the kernels. `gluon`: a Gluon module (gluon_prelude.py)."""
    body = "\n".join(functions)
    helpers = helpers_for(body)
    head = (
        [GLUON_PRELUDE]
        if gluon
        else [
            "import triton",
            "import triton.language as tl",
            "from triton.language.extra import libdevice",
        ]
    )
    return "\n".join(
        [
            *head,
            *custom_imports(body),
            *([f"\n{helpers}\n"] if helpers else []),
            *functions,
        ]
    )


def pow2_at_least(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def indent(lines: list[str], n: int = 4) -> str:
    return "\n".join(" " * n + line for line in lines)
