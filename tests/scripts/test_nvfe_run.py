"""scripts/nvfe_run.py's plumbing (no NVIDIA file involved): the import rewrite catches every form and
leaves nothing of the real frontend, notebooks convert to scripts, the LooseVersion stand-in orders as
distutils' does, the sample plugin is deterministic, and a whole run over a stand-in test folder writes
the per-file table."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nvfe_run.py"


def _module():
    spec = importlib.util.spec_from_file_location("nvfe_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NV = _module()


@pytest.mark.parametrize(
    "line,want",
    [
        ("import cudnn", "import opgraph.cudnn as cudnn"),
        ("    import cudnn  # frontend", "    import opgraph.cudnn as cudnn  # frontend"),
        ("import cudnn as cd", "import opgraph.cudnn as cd"),
        ("from cudnn import pygraph", "from opgraph.cudnn import pygraph"),
        (
            "        from cudnn.experimental.ops.sdpa import x",
            "        from opgraph.cudnn.experimental.ops.sdpa import x",
        ),
        ("from cudnn import (", "from opgraph.cudnn import ("),
        ("import cudnnx", "import cudnnx"),
        ("x = cudnn.pygraph()", "x = cudnn.pygraph()"),
    ],
)
def test_rewrite_catches_every_form(line, want):
    assert NV.rewrite_imports(line + "\n") == want + "\n"
    assert NV.leftover_imports(NV.rewrite_imports(line + "\n")) == []


def test_leftovers_are_reported():
    assert NV.leftover_imports("import torch, cudnn\n") == ["import torch, cudnn"]


def test_notebook_to_script(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["# title"]},
            {"cell_type": "code", "source": ["!pip install x\n", "%matplotlib inline\n", "import cudnn\n", "y = 1"]},
            {"cell_type": "code", "source": "if y:\n    !nvidia-smi\n    z = 2"},
        ]
    }
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    text = NV.rewrite_imports(NV.notebook_to_script(path))
    compile(text, "n.py", "exec")
    assert "import opgraph.cudnn as cudnn" in text and "pip install" not in text and "z = 2" in text


def test_looseversion_stand_in_orders_like_distutils():
    ns: dict = {}
    exec(NV.LOOSEVERSION, ns)
    lv = ns["LooseVersion"]
    assert lv("9.20.0") >= "9.14.0" and lv("9.9.0") < "9.10" and lv("9.10.2") > "9.10"
    assert lv("9.20.0") == "9.20.0" and not lv("9.20.0") < "9.20.0" and lv("2.12.0rc1") < lv("2.13")


def test_a_run_over_a_stand_in_folder(tmp_path):
    """A fake `.nvfe` (our own tiny test files, one passing, one failing, one skipping) through the real
    script: the rewrite, the sample of test_mhas.py, the junit counts, the table."""
    tests = tmp_path / "src" / "test" / "python"
    tests.mkdir(parents=True)
    (tmp_path / "src" / "samples" / "python").mkdir(parents=True)
    (tests / "test_mhas.py").write_text(
        "import cudnn\nimport random\nimport pytest\n\n"
        "@pytest.mark.parametrize('i', range(40))\n"
        "def test_sdpa(i):\n    assert cudnn.backend_version() >= 92000\n    assert random.random() < 2\n"
        "    if i % 5 == 0:\n        pytest.skip('a combination rule')\n"
    )
    (tests / "test_kernel_cache.py").write_text(
        "from cudnn import create_kernel_cache\n\ndef test_a():\n    create_kernel_cache().serialize()\n\n"
        "def test_b():\n    assert False, 'expected'\n"
    )
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--src",
        str(tmp_path / "src"),
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
        "--parts",
        "mhas,kernel_cache",
        "--mhas-sample",
        "20",
        "--jobs",
        "1",
        "--budget",
        "240",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((out / "nvfe_results.json").read_text())["tests"]
    mhas = result["test_mhas"]
    assert mhas["passed"] + mhas["skipped"] == 20 and mhas["failed"] == 0 and mhas["skipped"] >= 1
    assert (result["test_kernel_cache"]["passed"], result["test_kernel_cache"]["failed"]) == (1, 1)
    assert "| test_mhas |" in (out / "nvfe_results.md").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0
    assert json.loads((out / "nvfe_results.json").read_text())["tests"]["test_mhas"]["passed"] == mhas["passed"]
