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
    done = subprocess.run([sys.executable, "guide.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "block.json").exists() and (tmp_path / "block.plan").exists()
    for args in (["check", "block.json"], ["run", "block.json", "--device", "cpu", "--repeat", "1"],
                 ["explain", "block.plan"]):
        cli = subprocess.run([sys.executable, "-m", "opgraph", *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
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
