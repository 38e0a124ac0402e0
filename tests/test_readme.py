"""The README as a new user reads it (issue 20): the quick start runs as pasted on the CPU, and what
it names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import opgraph as og

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_quick_start_runs_as_pasted(tmp_path):
    block = re.search(r"## Quick start.*?```python\n(.*?)```", README, re.S)
    assert block, "README has no Python quick start"
    script = tmp_path / "quick_start.py"
    script.write_text(block.group(1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's shell
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "(8, 32, 12, 12) float16 True" in done.stdout, done.stdout


def test_it_says_how_to_install_with_pip():
    assert re.search(r"pip install \.\s", README) and 'pip install ".[torch,triton]"' in README


def test_the_numerical_notes_it_names_exist():
    sentence = re.search(r"numerical notes \((.*?)\) and", README, re.S)
    assert sentence
    named = re.findall(r"`(\w+)`", sentence.group(1))
    assert named and set(named) <= {n.value for n in og.NumericalNote}, named


def test_linked_files_exist():
    for target in re.findall(r"\]\(((?:examples|docs|bench)/[^)#]+)\)", README):
        assert (ROOT / target).exists(), target
