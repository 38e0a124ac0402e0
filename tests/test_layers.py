"""The package's layering, enforced: every import inside opgraph (module level, TYPE_CHECKING and
function level alike) goes to the same layer or one below, and module-level imports form no cycle.

    core  <-  ops, memory  <-  graph  <-  engines  <-  build  <-  runtime  <-  autodiff  <-  frontends,
    training  <-  cudnn (the frontend API)  <-  backend (the descriptor API)  <-  testing  <-  tools
    <-  the package's __init__

The one documented exception is the graph builder's facade (`Graph.build`, `Graph.engine_configs`,
`Graph.execute`), which calls the planner and the runtime lazily."""

from __future__ import annotations

import ast
import re
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
    ("opgraph.graph.builder", "opgraph.build.options"),  # Graph.build's options
    # g.sdpa_backward(score_mod=...) derives the modifier's derivative with autodiff's pointwise rules
    ("opgraph.ops.attention_builders", "opgraph.autodiff.score_mod"),
    # opgraph.compile differentiates the forward graph a training step starts from (tied parameters one
    # input, normalizations saving their statistics, autocast's casts): a sideways import within layer 7
    # (training imports no frontend); prepare_forward builds on graph and ops alone
    ("opgraph.frontends.autograd_module", "opgraph.training.forward"),
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
                bad.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {module} ({name}, layer {level}) imports "
                    f"{imported} ({other}, layer {other_level})"
                )
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


# the limit counts formatted lines: ruff format spends ~13% more lines than the hand-wrapped code 600 was set for
@pytest.mark.parametrize("limit", [700])
def test_no_source_file_is_huge(limit):
    big = [
        f"{p.relative_to(ROOT.parent)}: {n} lines"
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > limit
    ]
    assert not big, f"source files over {limit} lines (split them by concern):\n" + "\n".join(big)


# -- engines: independent of each other; build/ reaches them through the registry and the neutral modules --

# Each engine's modules; the rest of opgraph.engines is neutral (the registry, the contract, what several
# engines share), owned by no engine.
ENGINE_HOMES = {
    "reference": ("opgraph.engines.reference",),
    "triton": ("opgraph.engines.triton",),
    "torch": ("opgraph.engines.torch_engine",),
    "library": ("opgraph.engines.library",),
    "cudnn": (
        "opgraph.engines.cudnn_frontend",
        "opgraph.engines.cudnn_launch",
        "opgraph.engines.cudnn_lowering",
        "opgraph.engines.cudnn_padded",
        "opgraph.engines.cudnn_sdpa",
    ),
}
NEUTRAL_ENGINE_MODULES = (
    "opgraph.engines",  # the registry (get_engine, register_engine)
    "opgraph.engines.base",  # the engine and kernel contract
    "opgraph.engines.cost",  # the cost model: device rates, bytes and flops of a piece
    "opgraph.engines.artifacts",  # compiled code that plan files carry
    "opgraph.engines.shared",  # what several engines share: operand views, conv shape thresholds, ...
)


def _under(module: str, home: str) -> bool:
    return module == home or module.startswith(home + ".")


def _engine_of(module: str) -> str | None:
    """The engine whose module this is; None for a neutral module (or one outside opgraph.engines)."""
    for engine, homes in ENGINE_HOMES.items():
        if any(_under(module, h) for h in homes):
            return engine
    return None


def _neutral(module: str) -> bool:
    return module == "opgraph.engines" or any(_under(module, n) for n in NEUTRAL_ENGINE_MODULES[1:])


def test_every_engine_module_is_an_engines_or_neutral():
    stray = [m for m in MODULES if _under(m, "opgraph.engines") and _engine_of(m) is None and not _neutral(m)]
    assert not stray, f"modules of opgraph.engines that belong to no engine and are not neutral: {stray}"


def test_no_engine_imports_another_engine():
    """An engine reaches another only through the registry (get_engine); neutral modules import no engine."""
    bad = []
    for module, path in MODULES.items():
        if not _under(module, "opgraph.engines"):
            continue
        mine = _engine_of(module)
        for imported, line, _ in _imports(module, path):
            theirs = _engine_of(imported)
            if theirs is not None and theirs != mine:
                who = f"engine {mine}" if mine else "a neutral module"
                bad.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {module} ({who}) imports {imported} (engine {theirs})"
                )
    assert not bad, "imports between engines:\n" + "\n".join(bad)


def test_build_reaches_engines_through_the_registry_and_the_neutral_modules():
    bad = []
    for module, path in MODULES.items():
        if not _under(module, "opgraph.build"):
            continue
        for imported, line, _ in _imports(module, path):
            if _engine_of(imported) is not None:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} imports {imported}")
    assert not bad, "build/ importing an engine's modules (use get_engine and the Engine contract):\n" + "\n".join(bad)


# -- measurements live in bench/results/; the code keeps a line and a link -----------------------------------

DATED = re.compile(r"20[0-9][0-9]-[01][0-9]-[0-3][0-9]")
RESULTS = ROOT.parent / "bench" / "results"
EVIDENCE = RESULTS / "constants.md"


def test_no_dated_measurement_in_the_package():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT.parent))
        bad += [
            f"{rel}:{i}: {line.strip()}"
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if DATED.search(line)
        ]
    assert not bad, (
        "dated measurements in opgraph/ (move the numbers to bench/results/constants.md and keep a "
        "line and a link):\n" + "\n".join(bad)
    )


def _sections(path: Path) -> set[str]:
    return {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)
    }


def test_links_to_the_evidence_name_its_sections():
    """Links from the package to a section of a bench/results/ note (constants.md, triton-preferences.md)."""
    found = {}
    bad = []
    for p in sorted(ROOT.rglob("*.py")):
        for name, a in re.findall(r"(constants|triton-preferences)\.md#([a-z0-9-]+)", p.read_text()):
            if name not in found:
                found[name] = _sections(RESULTS / f"{name}.md")
            if a not in found[name]:
                bad.append(f"{p.relative_to(ROOT.parent)}: {name}.md#{a}")
    assert not bad, "links to sections their bench/results/ note does not have:\n" + "\n".join(bad)


# (module, expression): private reads in runtime/ that are not another opgraph object's state
PRIVATE_READS_ALLOWED = {
    # PyTorch's fast read of the current stream (what Inductor calls), looked up once per plan
    ("opgraph.runtime.streams", "torch._C"),
}


def _private_reads(path: Path) -> list[tuple[int, str]]:
    """(line, expression) for every `x._name` whose x is not self or cls, and every `from m import
    _name`: reads of another object's or module's private state."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            found += [
                (node.lineno, f"from {'.' * node.level}{node.module or ''} import {a.name}")
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_runtime_reads_no_private_state_of_other_objects():
    """The runtime's shared state goes through typed objects and public methods (state.PlanState,
    threads.ThreadState, the binder's methods), never through another object's `_attributes`."""
    bad = []
    for module, path in MODULES.items():
        if not module.startswith("opgraph.runtime"):
            continue
        for line, expr in _private_reads(path):
            if (module, expr) not in PRIVATE_READS_ALLOWED:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {expr}")
    assert not bad, "private reads of other objects in runtime/:\n" + "\n".join(bad)
