"""The package's layering, enforced: every import inside opgraph (module level, TYPE_CHECKING and
function level alike) goes to the same layer or one below, and module-level imports form no cycle.

    core  <-  ops, memory  <-  graph  <-  engines  <-  build  <-  runtime  <-  autodiff  <-  frontends,
    training  <-  cudnn (the frontend API)  <-  backend (the descriptor API)  <-  testing  <-  tools
    <-  the package's __init__

The one documented exception is the graph builder's facade (`Graph.build`, `Graph.engine_configs`,
`Graph.execute`), which calls the planner and the runtime lazily."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "opgraph"

LAYERS = {
    "core": 0,
    "ops": 1,
    "memory": 1,
    "graph": 2,
    "engines": 3,
    "build": 4,
    "runtime": 5,
    "autodiff": 6,
    "frontends": 7,
    "training": 7,
    "cudnn": 8,
    "backend": 9,
    "testing": 10,
    "tools": 11,
    "__init__": 12,
    "__main__": 12,
}

# (importing module, imported module): imports that go up a layer on purpose, each documented where it is.
FACADES = {
    ("opgraph.graph.builder", "opgraph.build.planner"),
    ("opgraph.graph.builder", "opgraph.runtime.plan"),
    ("opgraph.graph.builder", "opgraph.build.heuristics"),  # the facade's return type
    # g.sdpa_backward(score_mod=...) derives the modifier's derivative with autodiff's pointwise rules
    ("opgraph.ops.attention_builders", "opgraph.autodiff.score_mod"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top not in LAYERS:
        raise AssertionError(f"{module}: package/module 'opgraph.{top}' has no layer; add it to LAYERS in {__file__}")
    return top, LAYERS[top]


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported opgraph module, line, at module level incl. TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[str, int, bool]] = []

    def target(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        if node.level > 1:
            base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                src = target(child)
                if src.startswith("opgraph"):
                    for alias in child.names:
                        sub = f"{src}.{alias.name}"
                        found.append((sub if sub in MODULES else src, child.lineno, top))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("opgraph"):
                        found.append((alias.name, child.lineno, top))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            else:
                visit(child, top)  # class bodies, `if TYPE_CHECKING:`, try/except at module level

    visit(tree, True)
    return [(m, line, top) for m, line, top in found if m in MODULES]


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_goes_up_a_layer():
    bad = []
    for module, path in MODULES.items():
        name, level = _layer(module)
        for imported, line, _ in _imports(module, path):
            other, other_level = _layer(imported)
            if (module, imported) in FACADES:
                continue
            if other_level > level or (other_level == level and other != name):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} ({name}, layer {level}) imports "
                           f"{imported} ({other}, layer {other_level})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_module_level_imports_have_no_cycle():
    graph = {m: {i for i, _, top in _imports(m, p) if top and i != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is how packages re-export, not a cycle
    for m in graph:
        graph[m] = {i for i in graph[m] if not (MODULES[m].name == "__init__.py" and i.startswith(m + "."))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strongconnect(v)
    assert not cycles, "module-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("limit", [600])
def test_no_source_file_is_huge(limit):
    big = [f"{p.relative_to(ROOT.parent)}: {n} lines" for p in ROOT.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > limit]
    assert not big, f"source files over {limit} lines (split them by concern):\n" + "\n".join(big)
