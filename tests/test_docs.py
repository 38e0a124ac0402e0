"""The user guide's getting-started page runs as written on the CPU (issue 20: a new user follows
README and docs from a clean machine to a running graph, an explained plan and a saved plan), and
its pages name only what exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (DOCS / page).read_text(), re.S)


def test_getting_started_runs_as_written(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    code = "\n".join(_blocks("getting-started.md", "python"))
    (tmp_path / "guide.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's shell
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OPGRAPH_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "guide.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "block.json").exists() and (tmp_path / "block.plan").exists()
    for args in (
        ["check", "block.json"],
        ["run", "block.json", "--device", "cpu", "--repeat", "1"],
        ["explain", "block.plan"],
    ):
        cli = subprocess.run(
            [sys.executable, "-m", "opgraph", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert cli.returncode == 0, (args, cli.stdout[-2000:], cli.stderr[-2000:])


def test_the_graph_format_example_is_a_valid_graph(tmp_path):
    import opgraph as og

    (example,) = _blocks("graph-format.md", "json")
    g = og.Graph.from_json(example)
    assert g.final.tensor("y").dim == (8, 16)
    from opgraph.graph.schema import schema_errors
    import json

    assert schema_errors(json.loads(example)) == []


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, page


# -- README's layout of the code and docs/architecture.md's layers: every package named, every path real --

PACKAGE = ROOT / "opgraph"


def _layers_units() -> set[str]:
    """opgraph's top-level packages (`name/`) and modules (`name.py`): the units tests/test_layers.py layers."""
    return {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {
        p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")
    }


def _readme_layout() -> str:
    found = re.search(r"## Layout of the code.*?```\n(opgraph/\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert found, "README.md has no layout block under '## Layout of the code'"
    return found.group(1)


def _architecture() -> str:
    return (DOCS / "architecture.md").read_text()


def _named(text: str, unit: str) -> bool:
    return re.search(rf"(?<![\w/]){re.escape(unit)}", text) is not None


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_every_package_of_opgraph_is_named(page):
    text = _readme_layout() if page == "README.md" else _architecture().split("## The layers")[1].split("##")[0]
    missing = sorted(u for u in _layers_units() if not _named(text, u))
    assert not missing, f"{page} does not name {missing} (the layout of the code / the layer table)"


def _exists(path: str) -> bool:
    """A path as the pages write it: from the repository, from opgraph/ (a module without .py, or a module
    and a name in it), a glob of module names, or a docs page."""
    candidates = [ROOT / path, PACKAGE / path, PACKAGE / f"{path}.py", DOCS / path]
    if "*" in path:
        return any(PACKAGE.rglob(path.rsplit("/", 1)[-1]))
    return any(c.exists() for c in candidates)


def test_the_paths_the_layout_pages_name_exist():
    tops = {p.name for d in (ROOT, PACKAGE, DOCS) for p in d.iterdir() if p.is_dir()}  # not prose: "save/load"
    missing = []
    for page, text in (("README.md", _readme_layout()), ("docs/architecture.md", _architecture())):
        # folder/module paths (graph/builder, build/options.BuildOptions, engines/triton/templates/base.py)
        for path in re.findall(r"(?<![\w./-])([a-z_]+(?:/[a-z_*]+)+(?:\.py|\.md|/)?)(?![\w-])", text):
            if path.split("/")[0] in tops and not _exists(path.rstrip("/")):
                missing.append(f"{page}: {path}")
        # module files named alone (state.py, dynamo_*.py)
        for name in re.findall(r"(?<![\w/.])([a-z_*]+\.py)\b", text):
            if not any(PACKAGE.rglob(name)):
                missing.append(f"{page}: {name}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)
