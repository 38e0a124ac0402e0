"""Where each op kind is known, computed from the registries: the table of docs/op-table.md.

For every registered op kind: the builders that add it (`g.<builder>`), whether it has a reference
implementation and a torch mapping, the Triton templates whose main op it is (or how generated kernels
take it in: fused elementwise, read in place as a view), the library and cuDNN engines, its backward
rule (or why it has none), the aten ops the PyTorch importer translates into it, and the cuDNN backend
descriptors that lower to it. `python -m opgraph.tools.op_table --write` regenerates the page;
tests/tools/test_op_table.py fails while it is stale and while an op lacks a reference, a torch mapping,
or a backward rule it is not listed without (autodiff's NOT_DIFFERENTIABLE).

Which builders, translators and lowerings make which op kind is read from their code: the op classes
each one names, in its source, its closure, and the module functions it calls (a few levels deep).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.op import BUILDERS, OPS, Op

PAGE = Path(__file__).resolve().parents[2] / "docs" / "op-table.md"


@dataclass(frozen=True)
class OpPlaces:
    """Where one op kind is known (see the module docstring); empty tuples: nowhere."""

    kind: str
    family: str  # the ops module that defines it
    builders: tuple[str, ...]
    reference: bool
    torch: bool
    triton: tuple[str, ...]
    library: bool
    cudnn_engine: bool
    backward: str  # "rule", "per mode (n of m)", "per custom op", or "none: why"
    aten: tuple[str, ...]
    cudnn: tuple[str, ...]  # backend descriptor types (CUDNN_BACKEND_OPERATION_*_DESCRIPTOR, shortened)


def _kinds_named(fn: Any, depth: int = 3, seen: set[int] | None = None) -> set[str]:
    """Op kinds `fn` makes: the op classes its code names (not in isinstance checks) or holds in its closure,
    the builders it calls (`g.<builder>(...)`, or by name in its closure), and those of the opgraph
    functions it calls, `depth` levels down."""
    seen = set() if seen is None else seen
    if id(fn) in seen or not callable(fn):
        return set()
    seen.add(id(fn))
    kinds: set[str] = set()
    for v in (c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)):
        if isinstance(v, type) and issubclass(v, Op) and v.kind:
            kinds.add(v.kind)
        elif isinstance(v, str) and v in BUILDERS and BUILDERS[v] is not fn:
            kinds |= _kinds_named(BUILDERS[v], depth, seen)
        elif inspect.isfunction(v) and depth > 0:
            kinds |= _kinds_named(v, depth - 1, seen)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return kinds
    scope = getattr(fn, "__globals__", {})
    checked = {
        id(a)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("isinstance", "issubclass")
        for a in ast.walk(node)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in BUILDERS
            and isinstance(node.func.value, (ast.Name, ast.Attribute))
            and _names_graph(node.func.value)
        ):
            kinds |= _kinds_named(BUILDERS[node.func.attr], depth, seen)  # g.relu(...), imp.g.add(...)
        elif isinstance(node, ast.Name) and id(node) not in checked:
            obj = scope.get(node.id)
            if isinstance(obj, type) and issubclass(obj, Op) and obj.kind:
                kinds.add(obj.kind)
            elif inspect.isfunction(obj) and obj.__module__.startswith("opgraph.") and depth > 0:
                kinds |= _kinds_named(obj, depth - 1, seen)
    return kinds


def _names_graph(value: ast.expr) -> bool:
    """Whether `value` is what builders are called on: `g`, `self` (a builder calling another), `x.g`,
    `imp` (the importer's helpers of the same names: `imp.reshape`, `imp.reduction`)."""
    if isinstance(value, ast.Name):
        return value.id in ("g", "self", "graph", "imp")  # imp: the importer's reshape, reduction
    return isinstance(value, ast.Attribute) and value.attr in ("g", "graph")


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _inverse(table: Iterable[tuple[str, Callable[..., Any]]]) -> dict[str, set[str]]:
    """kind -> the names (of `table`'s entries) whose function makes it."""
    out: dict[str, set[str]] = {}
    for name, fn in table:
        for kind in _kinds_named(fn):
            out.setdefault(kind, set()).add(name)
    return out


def _optional(make: Callable[[], Any], default: Any) -> Any:
    """What `make()` gives, or `default` where an optional dependency (torch, triton) is missing."""
    try:
        return make()
    except ImportError:
        return default


def _torch_mappings() -> set[str]:
    from ..engines.torch_engine import IMPLS

    return set(IMPLS)


def _templates() -> dict[str, list[str]]:
    from ..engines.triton.templates import discover

    out: dict[str, list[str]] = {}
    for t in discover():
        for kind in t.main_kinds:
            out.setdefault(kind, []).append(t.name)
    return out


def _translators() -> dict[str, set[str]]:
    # every module that registers translations, AOTAutograd's backward ops included (imported here, not by
    # whatever ran before: the table must not depend on it)
    from ..frontends.torch_ops import load_translators

    return _inverse(load_translators(aot=True).items())


def _lowerings() -> dict[str, set[str]]:
    from ..backend.lowering import LOWER

    short = {d: d.name.removeprefix("CUDNN_BACKEND_").removesuffix("_DESCRIPTOR") for d in LOWER}
    return _inverse((short[d], fn) for d, fn in LOWER.items())


def op_table() -> list[OpPlaces]:
    """Every registered op kind and where it is known (see the module docstring), sorted by family, kind."""
    from ..autodiff import NOT_DIFFERENTIABLE, NOT_DIFFERENTIABLE_MODES, POINTWISE_RULES, RULES
    from ..engines import cudnn_frontend, library
    from ..ops.custom import Custom
    from ..ops.layout import VIEW_KINDS
    from ..ops.pointwise import MODES, Pointwise

    builders = _inverse(BUILDERS.items())
    torch_kinds = _optional(_torch_mappings, set())
    templates = _optional(_templates, {})
    aten = _optional(_translators, {})
    lowered = _lowerings()
    cudnn_kinds = cudnn_frontend.ANCHORS | cudnn_frontend.OTHER_KINDS
    rows = []
    for kind, cls in OPS.items():
        triton = list(templates.get(kind, []))
        if issubclass(cls, Pointwise):
            triton.append("fused elementwise")
        elif kind in VIEW_KINDS:
            triton.append("read in place (a view)")
        elif cls is Custom:
            triton.append("fused elementwise (with a Triton function)")
        if kind in RULES:
            backward = "rule"
        elif cls is Pointwise:
            done = sum(1 for m in MODES if m in POINTWISE_RULES)
            backward = f"per mode ({done} of {len(MODES)}; none for the {len(NOT_DIFFERENTIABLE_MODES)} *_BWD modes)"
        elif cls is Custom:
            backward = "per custom op (register_custom_grad)"
        else:
            backward = f"none: {NOT_DIFFERENTIABLE[kind]}" if kind in NOT_DIFFERENTIABLE else ""
        rows.append(
            OpPlaces(
                kind,
                cls.__module__.removeprefix("opgraph.ops."),
                tuple(sorted(builders.get(kind, ()))),
                cls.reference is not Op.reference,
                kind in torch_kinds,
                tuple(triton),
                kind in library.GEMM_KINDS,
                kind in cudnn_kinds,
                backward,
                tuple(sorted(aten.get(kind, ()))),
                tuple(sorted(lowered.get(kind, ()))),
            )
        )
    return sorted(rows, key=lambda r: (r.family, r.kind))


def problems(rows: list[OpPlaces]) -> list[str]:
    """What the table says is missing: a reference or torch mapping, or a backward rule not accounted for."""
    from ..autodiff import NOT_DIFFERENTIABLE_MODES, POINTWISE_RULES
    from ..ops.pointwise import MODES

    out = []
    for r in rows:
        if not r.reference:
            out.append(f"{r.kind}: no reference implementation (Op.reference)")
        if not r.torch:
            out.append(f"{r.kind}: no torch mapping (engines/torch_engine, @implements)")
        if not r.backward:
            out.append(f"{r.kind}: no backward rule (autodiff/rules_*.py) and not in autodiff's NOT_DIFFERENTIABLE")
    out += [
        f"pointwise {m.name}: no backward rule and not in NOT_DIFFERENTIABLE_MODES"
        for m in MODES
        if m not in POINTWISE_RULES and m not in NOT_DIFFERENTIABLE_MODES
    ]
    return out


def _cell(values: Iterable[str]) -> str:
    text = ", ".join(f"`{v}`" for v in values)
    return text or "—"


def render(rows: list[OpPlaces]) -> str:
    """The markdown page."""
    yes = {True: "yes", False: "—"}
    lines = [
        "# Where each op is known",
        "",
        "Generated from the registries by `python -m opgraph.tools.op_table --write` (tests/tools/test_op_table.py",
        "fails while this page is stale). What each column means, and every place a new op touches:",
        "[Adding an op](adding_an_op.md).",
        "",
        "| op kind | family | builders | reference | torch | Triton | library | cuDNN engine | backward | "
        "importer (aten) | cuDNN backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r.kind}` | {r.family} | {_cell(r.builders)} | {yes[r.reference]} | {yes[r.torch]} | "
            f"{', '.join(r.triton) or '—'} | {yes[r.library]} | {yes[r.cudnn_engine]} | {r.backward or '—'} | "
            f"{_cell(r.aten)} | {_cell(r.cudnn)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE}")
    args = parser.parse_args(argv)
    rows = op_table()
    text = render(rows)
    if args.write:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(text)
    for p in problems(rows):
        print("missing:", p, file=sys.stderr)
    return 1 if problems(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
