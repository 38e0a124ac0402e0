"""Package conventions (issue 20): typed, runnable with -m, one version, light to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import opgraph as og

ROOT = Path(__file__).resolve().parents[1]


def test_typed_and_one_version_source():
    assert (ROOT / "opgraph" / "py.typed").exists()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "opgraph.core.version.__version__"' in pyproject
    assert "\nversion =" not in pyproject.split("[project]")[1].split("[")[0]
    assert og.__version__.count(".") == 2


def test_import_opgraph_leaves_the_heavy_parts_for_first_use():
    code = (
        "import sys, opgraph as og\n"
        "lazy = ('opgraph.testing', 'opgraph.training', 'opgraph.autodiff', 'opgraph.frontends', 'torch', 'triton')\n"
        "print(sorted(m for m in lazy if m in sys.modules))\n"
        "og.grad, og.GradGraph, og.testing.compare, og.training.sgd_momentum\n"
        "from opgraph import from_torch, grad\n"
        "print(sorted(m for m in lazy[:4] if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "[]", first
    assert second == str(sorted(["opgraph.testing", "opgraph.training", "opgraph.autodiff", "opgraph.frontends"]))
    assert "grad" in dir(og) and "from_torch" in og.__all__
