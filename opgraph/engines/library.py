"""The library engine: a piece's GEMM-class op (convolution forward, data or filter gradient,
matmul) through the library PyTorch calls for it (cuDNN, cuBLAS), and the piece's prologue and
epilogue as generated Triton kernels before and after it. A lone 16-bit matmul (shared.native_gemm)
is its piece too, the library call alone writing the output buffer: the build's policy lets it lead
there (PieceFact.NATIVE_GEMM; other lone convolutions and matmuls stay the torch engine's).

It answers "should cuDNN's conv run, followed by my own fused kernel, or one generated kernel with
everything fused?" by offering the first as an alternative to the second on every GEMM-class piece
the Triton engine forms: `build(autotune=True)` times both and keeps the faster whole piece, and
`describe()` lists the other with its time. The tensors between the parts (the conv's output before
its epilogue, a prologue's output before the conv) live in the kernel's own scratch.

A config's knobs are the parts' knobs under a prefix (`prologue.`, `epilogue.`), so a plan that names
one compiles the same kernels again (plan files, the tuning cache). Knob `precision`: "exact" keeps a
16-bit conv's declared fp32 output (PyTorch then convolves in fp32, TF32 on tensor cores: exact for
16-bit inputs, but several times slower than the fused Triton kernel:
bench/results/constants.md#library-precision); "native" (heuristic mode B, so autotuning weighs it)
runs the conv in the operands' type, as eager PyTorch does, and says so with
NumericalNote.ROUNDED_INTERMEDIATE: build(autotune=True, deselect_numeric_notes=["rounded_intermediate"])
keeps every intermediate in its declared type. "wide" (mode B too) is the other way round: a 16-bit matmul
whose product is only cast to fp32 (a weight gradient under autocast) has cuBLAS write the fp32 result as it
accumulates (`wide_graph`; faster than the product and its cast: bench/results/constants.md#hopper-small-tiles),
without the bf16 rounding the graph declares
(NumericalNote.WIDENED_INTERMEDIATE). Each part runs its engine's first config for the mode.
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import AttributeValueError
from ..core.ir import FinalGraph, Node
from ..core.piece import Piece, make_piece
from ..memory import workspace as wsp
from ..memory.buffers import address_of
from ..ops.layout import VIEW_KINDS
from ..ops.pointwise import PointwiseMode
from . import get_engine, register_engine
from .base import Binding, Compiler, Engine, EngineFacts, Kernel, Launcher, PieceFact
from .shared.native_gemm import NATIVE_16, native_gemm, widening_types

GEMM_KINDS = ("conv_fprop", "conv_dgrad", "conv_wgrad", "matmul")
ENGINE_OF = {"prologue": "triton", "main": "torch", "epilogue": "triton"}
# a composite is only as capturable / device-scalar-reading as every part
_ALL_PARTS = {
    BehaviorNote.CUDA_GRAPH_CAPTURABLE,
    BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API,
    BehaviorNote.DEVICE_SCALARS,
}


def _main(piece: Piece) -> int | str:
    mains = [i for i, n in enumerate(piece.nodes) if n.kind in GEMM_KINDS]
    if len(mains) != 1:
        return f"the library engine runs pieces with one convolution or matmul; this one has {len(mains)}"
    if len(piece.nodes) == 1 and not native_gemm(piece):
        return (
            "a lone convolution or matmul other than a 16-bit GEMM of one type is the torch engine's (nothing "
            "to generate around it)"
        )
    return mains[0]


def native_graph(piece: Piece) -> FinalGraph | None:
    """The piece's graph with the main op's output in its 16-bit operands' type, where that output is
    a wider intermediate (virtual, read only inside the piece); None where "native" changes nothing."""
    i = _main(piece)
    if isinstance(i, str):
        return None
    node, tensors = piece.nodes[i], piece.graph.tensors
    a, b = (tensors[u].data_type for u in node.input_uids()[:2])
    out = node.output_uids()[0]
    y = tensors[out]
    if a is not b or a not in NATIVE_16 or y.data_type is a or not y.is_virtual or out in piece.outputs:
        return None
    return dataclasses.replace(piece.graph, tensors={**tensors, out: dataclasses.replace(y, data_type=a)})


def wide_graph(piece: Piece) -> tuple[FinalGraph, dict[int, int]] | None:
    """Where the piece ends in a 16-bit matmul whose product only an identity cast to fp32 reads (AOTAutograd's
    weight gradient: `mm`, then `_to_copy` to the weight's fp32), the piece's graph with the product in the
    cast's type and layout, and {product uid: the cast's output uid}: the library call writes the cast's
    output itself, in fp32 (`torch_engine.gemm.widened`), the bf16 rounding the graph declares skipped. None
    elsewhere."""
    i = _main(piece)
    if isinstance(i, str) or i + 2 != len(piece.nodes) or piece.nodes[i].kind != "matmul":
        return None
    node, cast = piece.nodes[i], piece.nodes[-1]
    tensors = piece.graph.tensors
    a, b = (tensors[u].data_type for u in node.input_uids()[:2])
    product = node.output_uids()[0]
    y = tensors[product]
    if cast.kind != "pointwise" or getattr(cast.op, "mode", None) is not PointwiseMode.IDENTITY:
        return None
    if cast.input_uids() != (product,) or len(cast.output_uids()) != 1:
        return None
    z = tensors[cast.output_uids()[0]]
    if not widening_types(a, b, z.data_type) or y.data_type is not a:
        return None
    if not y.is_virtual or product in piece.outputs or z.dim != y.dim or node.compute_data_type is not DataType.FLOAT:
        return None
    widened = dataclasses.replace(z, uid=product, name=y.name, is_virtual=True)
    return dataclasses.replace(piece.graph, tensors={**tensors, product: widened}), {product: z.uid}


def split(piece: Piece, precision: str = "exact") -> list[tuple[str, Piece]] | str:
    """The piece as (role, sub-piece) parts in run order, or why it has no such split. "native"
    precision: the parts of `native_graph`; "wide": those of `wide_graph` (no epilogue)."""
    i = _main(piece)
    if isinstance(i, str):
        return i
    wide = wide_graph(piece) if precision == "wide" else None
    graph = native_graph(piece) if precision == "native" else wide[0] if wide else piece.graph
    assert _applies(precision, piece) and graph is not None, f"{precision} precision asked where it does not apply"
    if native_gemm(piece):  # a lone 16-bit GEMM: the library call alone (and its operands' views), into the output
        return [("main", make_piece(graph, piece.index, list(piece.nodes)))]
    prologue, views = _operand_views(piece, i)
    if not wide and not prologue and i + 1 == len(piece.nodes):
        return "its ops around the convolution or matmul are views, which the torch engine runs with it"
    groups: list[tuple[str, Sequence[Node]]] = [
        ("prologue", prologue),
        ("main", [*views, piece.nodes[i]]),
        ("epilogue", () if wide else piece.nodes[i + 1 :]),  # (wide: the main op writes the cast's output)
    ]
    return [(role, make_piece(graph, piece.index, list(nodes))) for role, nodes in groups if nodes]


def _operand_views(piece: Piece, i: int) -> tuple[list[Node], list[Node]]:
    """The ops before the main one (at `i`) split in two: the prologue the generated kernel runs, and the
    views that only shape the main op's operands out of the piece's inputs (a weight given a unit batch
    axis, an attention output transposed and merged into rows), which the torch engine runs with the
    main op (PyTorch's reshape copies only where it must). Operands shaped two ways (a batch reshape of
    B beside A's views) make no one pointwise kernel, but each is one torch call."""
    before = piece.nodes[:i]
    made_by = {u: id(n) for n in before for u in n.output_uids()}
    read_by: dict[int, set[int]] = {}
    for n in piece.nodes:
        for u in n.input_uids():
            read_by.setdefault(u, set()).add(id(n))
    main = id(piece.nodes[i])
    moved = {id(n) for n in before if n.kind in VIEW_KINDS}
    changed = True
    while changed:  # (until every moved view reads inputs or moved views, and feeds only those or the main op)
        changed = False
        for n in before:
            if id(n) not in moved:
                continue
            sources_ok = all(u in piece.inputs or made_by.get(u) in moved for u in n.input_uids())
            readers_ok = all(
                u not in piece.outputs and read_by.get(u, set()) <= moved | {main} for u in n.output_uids()
            )
            if not (sources_ok and readers_ok):
                moved.discard(id(n))
                changed = True
    return [n for n in before if id(n) not in moved], [n for n in before if id(n) in moved]


def _prefixed(role: str, config: EngineConfig) -> tuple[tuple[str, Any], ...]:
    return tuple((f"{role}.{k}", v) for k, v in config.knobs)


def _part_config(role: str, config: EngineConfig) -> EngineConfig:
    prefix = f"{role}."
    knobs = tuple((k[len(prefix) :], v) for k, v in config.knobs if k.startswith(prefix))
    return EngineConfig(ENGINE_OF[role], knobs)


class LibraryKernel(Kernel):
    """Runs the parts' kernels in order, with the tensors between them in its scratch."""

    def __init__(
        self,
        piece: Piece,
        config: EngineConfig,
        parts: list[tuple[str, Piece, Kernel]],
        aliases: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__(piece, config)
        self.parts = parts
        # a part's output that is one of the piece's outputs under another uid (wide_graph's product)
        self.aliases = dict(aliases or {})
        graph = parts[0][1].graph  # the piece's, or its native_graph / wide_graph
        between = [[u for u in sub.outputs if u not in piece.outputs and u not in self.aliases] for _, sub, _ in parts]
        self.layout = wsp.plan_layout(graph, between, [k.scratch_bytes for _, _, k in parts])
        self.scratch_bytes = self.layout.size

    def _tensor_views(self, scratch: Any) -> dict[int, Any]:
        graph = self.parts[0][1].graph
        return wsp.tensor_views(scratch, self.layout, graph) if self.layout.tensors else {}

    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None:
        views = self._tensor_views(scratch) if self.scratch_bytes else {}
        bound = {**buffers, **views} if views else buffers
        if self.aliases:
            bound = {**bound, **{u: buffers[to] for u, to in self.aliases.items()}}
        for i, (_, _, kernel) in enumerate(self.parts):
            kernel.run(bound, stream, wsp.scratch_view(scratch, self.layout, i))

    def bind(self, binding: Binding, scratch: Any) -> Launcher:
        """The parts bound in order; the tensors between them are views of this kernel's scratch,
        made here once (a binding of its own that reads through to the plan's, aliases included)."""
        views = self._tensor_views(scratch) if self.scratch_bytes else {}
        buffers, pointers = binding.buffers, binding.pointers
        if self.aliases:
            buffers, pointers = _Aliased(buffers, self.aliases), _Aliased(pointers, self.aliases)  # type: ignore[assignment]
        child = Binding(
            ChainMap(views, buffers),  # type: ignore[arg-type]
            ChainMap({u: address_of(v) for u, v in views.items()}, pointers),  # type: ignore[arg-type]
            binding.stream,
            binding.preludes,
        )
        return CompositeLauncher(
            [
                kernel.bind(child, wsp.scratch_view(scratch, self.layout, i))
                for i, (_, _, kernel) in enumerate(self.parts)
            ],
            self.aliases,
        )

    def compile_specs(self) -> list[Any]:
        return [spec for _, _, kernel in self.parts for spec in kernel.compile_specs()]

    def artifacts(self) -> list[Any]:
        return [a for _, _, kernel in self.parts for a in kernel.artifacts()]

    def source(self) -> str | None:
        sources = [f"# -- {role}: {sub.label()}\n{k.source()}" for role, sub, k in self.parts if k.source()]
        return "\n\n".join(sources) or None


class _Aliased(Mapping[int, Any]):
    """A binding's live mapping (buffers or pointers) that also answers each alias with its target's value."""

    def __init__(self, base: Mapping[int, Any], aliases: Mapping[int, int]) -> None:
        self.base, self.aliases = base, aliases

    def __getitem__(self, uid: int) -> Any:
        return self.base[self.aliases.get(uid, uid)]

    def __iter__(self) -> Any:
        return iter(
            {**dict.fromkeys(self.base), **dict.fromkeys(u for u, to in self.aliases.items() if to in self.base)}
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)


class CompositeLauncher(Launcher):
    """Launchers run one after the other (a composite kernel's parts); a rebound uid rebinds its aliases."""

    def __init__(self, parts: list[Launcher], aliases: Mapping[int, int] | None = None) -> None:
        super().__init__([c for p in parts for c in p.calls])
        self.parts = parts
        self.aliases = aliases or {}

    def rebind(self, uids: Iterable[int]) -> bool:
        uids = list(uids)
        uids += [u for u, to in self.aliases.items() if to in uids]
        changed = False
        for p in self.parts:
            changed |= bool(p.rebind(uids))
        if changed:
            self.calls = [c for p in self.parts for c in p.calls]
        return changed


class LibraryEngine(Engine):
    name = "library"
    fuses_neighbours = True

    def available(self, device: Device) -> Support:
        for name in ("torch", "triton"):
            verdict = get_engine(name).available(device)
            if not verdict.ok:
                return Support.no(f"needs the {name} engine: {verdict.reason}")
        return Support.yes()

    def supports(self, piece: Piece, device: Device) -> Support:
        avail = self.available(device)
        if not avail.ok:
            return avail
        parts = split(piece)
        if isinstance(parts, str):
            return Support.no(parts)
        for role, sub in parts:
            verdict = get_engine(ENGINE_OF[role]).supports(sub, device)
            if not verdict.ok:
                return Support.no(
                    f"its {role} ({', '.join(n.name for n in sub.nodes)}) does not run as one "
                    f"{ENGINE_OF[role]} kernel: {verdict.reason}",
                    verdict.node,
                )
        if role_has_host(parts):
            return Support.no("the convolution or matmul has no torch mapping (it would run on the host)")
        return Support.yes()

    def facts(self, piece: Piece, device: Device) -> EngineFacts:
        """For a matmul piece (the policy's library rules are about matmuls), the estimate of its config,
        and whether the piece is a lone 16-bit matmul, which the library call runs as it is
        (PieceFact.NATIVE_GEMM)."""
        main = _main(piece)
        if not device.is_cuda or isinstance(main, str) or piece.nodes[main].kind != "matmul":
            return EngineFacts()
        config = self._config(piece, device, HeurMode.A, "exact")
        native = frozenset({PieceFact.NATIVE_GEMM}) if native_gemm(piece) else frozenset()
        return EngineFacts(None if config is None else config.estimate_us, native)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        precisions = ["exact"]
        if mode is HeurMode.B and native_graph(piece) is not None:
            precisions.append("native")
        if mode is HeurMode.B and device.is_cuda and wide_graph(piece) is not None:
            precisions.append("wide")
        configs = [self._config(piece, device, mode, p) for p in precisions]
        return [c for c in configs if c is not None]

    def _config(self, piece: Piece, device: Device, mode: HeurMode, precision: str) -> EngineConfig | None:
        parts = split(piece, precision)
        if isinstance(parts, str):
            return None
        chosen = []
        for role, sub in parts:
            options = get_engine(ENGINE_OF[role]).configs(sub, device, mode)
            if not options:
                return None
            chosen.append((role, options[0]))
        numerical = frozenset().union(*(c.numerical_notes for _, c in chosen))
        if precision == "native":
            numerical |= {NumericalNote.ROUNDED_INTERMEDIATE}
        if precision == "wide":
            numerical |= {NumericalNote.WIDENED_INTERMEDIATE}
        behavior = frozenset().union(*(c.behavior_notes for _, c in chosen))
        behavior -= {n for n in _ALL_PARTS if not all(n in c.behavior_notes for _, c in chosen)}
        estimates = [c.estimate_us for _, c in chosen]
        return EngineConfig(
            "library",
            (("main", "torch"), ("precision", precision), *(kv for role, c in chosen for kv in _prefixed(role, c))),
            numerical_notes=numerical,
            behavior_notes=behavior,
            estimate_us=None if None in estimates else sum(estimates),  # type: ignore[arg-type]
            why=" then ".join(f"{role} on {c.engine}" for role, c in chosen) + f", {precision}, {mode.name} heuristic",
        )

    def engines_used(self, config: EngineConfig) -> frozenset[str]:
        roles = {k.split(".", 1)[0] for k, _ in config.knobs if "." in k}
        return frozenset({self.name, "torch", *(ENGINE_OF[r] for r in roles if r in ENGINE_OF)})

    def compiler(self) -> Compiler | None:
        """Its parts' compile specs are their engines': the generated prologue's and epilogue's (triton)."""
        return get_engine(ENGINE_OF["epilogue"]).compiler()

    def kernel_at(self, kernel: Kernel, piece: Piece, device: Device) -> Kernel | None:
        """The kernel at another shape of its bucket: each part from its own engine's `kernel_at` (a
        generated prologue or epilogue taking its sizes at run time re-pointed, the library call made
        again for the part), `repointed` where every part is; the engine's default where a part's
        engine has no kernel for it there."""
        precision = kernel.config.knob("precision", "exact")
        if isinstance(kernel, LibraryKernel) and _applies(precision, piece):
            parts = split(piece, precision)
            if not isinstance(parts, str) and [r for r, _ in parts] == [r for r, _, _ in kernel.parts]:
                shaped = []
                for (role, sub), (_, _, part) in zip(parts, kernel.parts):
                    at = get_engine(part.config.engine).kernel_at(part, sub, device)
                    if at is None:
                        break
                    shaped.append((role, sub, at))
                else:
                    out = LibraryKernel(piece, kernel.config, shaped, _aliases(precision, piece))
                    out.repointed = all(k.repointed for _, _, k in shaped)
                    return out
        return super().kernel_at(kernel, piece, device)

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        compiled = []
        for role, sub in self._checked_parts(piece, config):
            part = _part_config(role, config)
            compiled.append((role, sub, get_engine(part.engine).compile(sub, part, device)))
        return LibraryKernel(piece, config, compiled, _aliases(config.knob("precision", "exact"), piece))

    @staticmethod
    def _checked_parts(piece: Piece, config: EngineConfig) -> list[tuple[str, Piece]]:
        """The parts `config` runs; a typed error where it cannot run the piece (a damaged plan file)."""
        precision = config.knob("precision", "exact")
        if precision not in PRECISIONS:
            problem = f"precision {precision!r} is none of {', '.join(map(repr, PRECISIONS))}"
        elif not _applies(precision, piece):
            problem = (
                "precision 'native' applies to a 16-bit conv or matmul with a wider virtual output only"
                if precision == "native"
                else "precision 'wide' applies to a 16-bit matmul whose product only an identity cast to fp32 reads"
            )
        else:
            parts = split(piece, precision)
            if isinstance(parts, str):
                problem = parts
            else:
                missing = [
                    role
                    for role, _ in parts
                    if ENGINE_OF[role] == "triton" and _part_config(role, config).knob("template") is None
                ]
                if not missing:
                    return parts
                problem = f"no knobs for its {' and '.join(missing)} (expected '{missing[0]}.template' and the rest)"
        raise AttributeValueError(
            f"library config {config} cannot run {piece.label()}: {problem}",
            op=piece.nodes[0].label(),
            rule="library.config",
            hint="take library configs from engine_configs() or from a plan the engine built",
        )


PRECISIONS = ("exact", "native", "wide")


def _applies(precision: str, piece: Piece) -> bool:
    if precision == "native":
        return native_graph(piece) is not None
    if precision == "wide":
        return wide_graph(piece) is not None
    return True


def _aliases(precision: str, piece: Piece) -> dict[int, int]:
    wide = wide_graph(piece) if precision == "wide" else None
    return wide[1] if wide else {}


class _HostAware(Protocol):
    """The torch engine, as the registry gives it: which of a piece's ops it has no mapping of."""

    def host_ops(self, piece: Piece) -> list[str]: ...


def role_has_host(parts: list[tuple[str, Piece]]) -> bool:
    torch = cast(_HostAware, get_engine(ENGINE_OF["main"]))
    return any(role == "main" and torch.host_ops(sub) for role, sub in parts)


register_engine(LibraryEngine())
__all__ = ["LibraryEngine", "LibraryKernel", "split", "native_graph", "wide_graph"]
