"""Every numbered example runs to completion and reports no mismatch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("[0-9][0-9]_*.py"))
# examples that need a GPU, or too long for CI, say so in their first line with "needs: gpu"
CPU_EXAMPLES = [p for p in EXAMPLES if "needs: gpu" not in p.read_text().splitlines()[0]]


@pytest.mark.parametrize("path", CPU_EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=path.parent.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MISMATCH" not in proc.stdout, proc.stdout[-3000:]
