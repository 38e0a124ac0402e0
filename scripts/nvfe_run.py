#!/usr/bin/env python3
"""Run NVIDIA's cudnn-frontend Python tests and sample notebooks against opgraph.cudnn (issue 41).

The tests and notebooks are NVIDIA's (their license): they are never committed here. Carry a copy in
the ignored folder `.nvfe/` at the repository root (`.nvfe/test/python/...`, `.nvfe/samples/python/...`);
this script copies them to a work folder, changes only the import (`import cudnn` -> `import
opgraph.cudnn as cudnn`, `from cudnn...` -> `from opgraph.cudnn...`), refuses to run if any import of
the real frontend is left, and runs:

  - test_mhas.py on a deterministic sample (the N test ids of smallest SHA-1, N = --mhas-sample, 4000 by
    default, of which about 1,100 run: the rest skip by the test's own combination rules) with Python's `random` seeded from each test id (the test draws its shapes from the
    unseeded module-level `random`: without the seed no two runs test the same shapes);
  - test_mhas_v2.py, test_sdpa_thd.py, test_sdpa_chunked_prefill.py, test_flexible_sdpa*.py and
    test_kernel_cache.py whole (the L0 marker of NVIDIA's pytest.ini);
  - the notebooks 01, 10, 20-29, 50-53, 60, 61, converted to scripts (code cells in order; `!` shell
    lines and `%` magics dropped), each in a fresh interpreter.

It writes $OUT/nvfe_results.md and .json (per file: passed / failed / errors / skipped and the pass
rate of the cases that did not skip; per notebook: ok or the error), the pytest logs and JUnit files,
and the most frequent failure and skip reasons per file. Parts can be run separately (--parts) and
a file in shards (--shard i/n, by the same hash order) so that each device call stays within its time
limit.

    python3 scripts/nvfe_run.py [--parts mhas,v2,thd,chunked,flexible,kernel_cache,samples]
                                [--mhas-sample 1200] [--shard 0/1] [--jobs 8] [--timeout 180]
                                [--engines torch,reference] [--budget 560] [--collect-only] [--fake-cuda]

--collect-only (with --fake-cuda on a machine without a GPU) checks the plumbing: the rewrite, that
every file collects against opgraph.cudnn, and that every notebook converts and compiles. --cpu runs
the tests with their CUDA tensors made on the CPU (torch's factories patched in the test processes):
opgraph.cudnn's code paths on a machine without a GPU (-k picks a subset; slow, not an acceptance run).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_PARTS = {
    "mhas": ["test_mhas.py"],
    "v2": ["test_mhas_v2.py"],
    "thd": ["test_sdpa_thd.py"],
    "chunked": ["test_sdpa_chunked_prefill.py"],
    "flexible": ["test_flexible_sdpa.py", "test_flexible_sdpa_bprop.py"],
    "kernel_cache": ["test_kernel_cache.py"],
}
NOTEBOOKS = ["01", "10", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "50", "51", "52", "53", "60", "61"]

_IMPORT = re.compile(r"^(?P<indent>\s*)import cudnn(?P<rest>(\s+as\s+\w+)?\s*(#.*)?)$")
_IMPORT_SUB = re.compile(r"^(?P<indent>\s*)import cudnn\.(?P<mod>[\w.]+)(?P<rest>\s*(#.*)?)$")
_FROM = re.compile(r"^(?P<indent>\s*)from cudnn(?P<mod>(\.[\w.]+)?)\s+import\b")
_LEFT = re.compile(r"^\s*(import\s+cudnn\b|from\s+cudnn\b|import\s+.*,\s*cudnn\b)", re.M)


def rewrite_imports(text: str) -> str:
    """`import cudnn` -> `import opgraph.cudnn as cudnn` in every form (see the module docstring)."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        end = line[len(body) :]
        m = _IMPORT.match(body)
        if m:
            alias = re.search(r"as\s+(\w+)", m["rest"] or "")
            name = alias.group(1) if alias else "cudnn"
            comment = re.search(r"#.*", m["rest"] or "")
            body = f"{m['indent']}import opgraph.cudnn as {name}" + (f"  {comment.group(0)}" if comment else "")
        elif _IMPORT_SUB.match(body):
            m = _IMPORT_SUB.match(body)
            body = f"{m['indent']}import opgraph.cudnn as cudnn; import opgraph.cudnn.{m['mod']}{m['rest']}"
        elif _FROM.match(body):
            m = _FROM.match(body)
            body = _FROM.sub(f"{m['indent']}from opgraph.cudnn{m['mod']} import", body, count=1)
        out.append(body + end)
    return "".join(out)


def leftover_imports(text: str) -> list[str]:
    return [m.group(0).strip() for m in _LEFT.finditer(text)]


# -- the pytest plugin written next to the copied tests ---------------------------------------------------

PLUGIN = r'''
"""Deterministic sampling and seeding of NVIDIA's tests for the opgraph harness (scripts/nvfe_run.py)."""
import hashlib
import os
import random

import pytest

_SAMPLE = int(os.environ.get("NVFE_MHAS_SAMPLE", "0") or 0)
_SHARD = os.environ.get("NVFE_SHARD", "0/1")


def _key(nodeid):
    return hashlib.sha1(nodeid.encode()).hexdigest()


def pytest_collection_modifyitems(config, items):
    """test_mhas.py: the _SAMPLE ids of smallest SHA-1; then every file: shard i of n by that order."""
    ids = [i.nodeid for i in items]
    mhas = [n for n in ids if n.split("::")[0].endswith("test_mhas.py")]
    keep = set(ids) - set(mhas) | set(sorted(mhas, key=_key)[:_SAMPLE] if _SAMPLE else mhas)
    index, count = (int(x) for x in _SHARD.split("/"))
    keep = {n for k, n in enumerate(sorted(keep, key=_key)) if k % count == index}
    drop = [i for i in items if i.nodeid not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = [i for i in items if i.nodeid in keep]


@pytest.fixture(autouse=True)
def _nvfe_seed(request):
    random.seed(int(_key(request.node.nodeid)[:12], 16))
    yield
'''

FAKE_CUDA = r'''
"""--fake-cuda: let NVIDIA's conftest configure on a machine without a GPU (collection only)."""
import torch

torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a, **k: "fake (collection only)"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.device_count = lambda: 1
'''

CPU = r'''
"""--cpu: NVIDIA's tests as they are, with their CUDA tensors made on the CPU (a plumbing check of the
harness and of opgraph.cudnn's code paths on a machine without a GPU; not an acceptance run)."""
import functools

import torch

_FACTORIES = ("randn", "rand", "randint", "zeros", "ones", "empty", "full", "tensor", "arange", "linspace",
              "empty_strided", "randn_like", "zeros_like", "empty_like", "ones_like", "full_like", "as_tensor",
              "randperm", "eye")


def _cpu(kwargs):
    d = kwargs.get("device")
    if d is not None and "cuda" in str(d):
        kwargs["device"] = "cpu"
    return kwargs


def _wrap(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **_cpu(kwargs))
    return inner


for _name in _FACTORIES:
    setattr(torch, _name, _wrap(getattr(torch, _name)))
_to = torch.Tensor.to


def _tensor_to(self, *args, **kwargs):
    args = tuple("cpu" if (isinstance(a, (str, torch.device)) and "cuda" in str(a)) else a for a in args)
    return _to(self, *args, **_cpu(kwargs))


torch.Tensor.to = _tensor_to
torch.Tensor.cuda = lambda self, *a, **k: self
_Generator = torch.Generator


class _CpuGenerator(_Generator):
    def __new__(cls, device="cpu"):
        return _Generator("cpu")


torch.Generator = _CpuGenerator


class _Stream:
    cuda_stream = 0

    def __init__(self, *a, **k):
        pass


class _Props:
    multi_processor_count = 132
    name = "cpu (plumbing run)"
    major, minor = 9, 0
    total_memory = 1 << 40


torch.cuda.is_available = lambda: True
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_stream = lambda *a, **k: _Stream()
torch.cuda.Stream = _Stream
torch.cuda.get_device_name = lambda *a, **k: "cpu (plumbing run)"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_properties = lambda *a, **k: _Props()
torch.cuda.device_count = lambda: 1
torch.cuda.empty_cache = lambda: None
_fork = torch.random.fork_rng
torch.random.fork_rng = lambda devices=None, **k: _fork(devices=[], **k)

import opgraph.core.device  # noqa: E402  (opgraph itself must see the CPU)

opgraph.core.device.cuda_usable = lambda: False
'''

LOOSEVERSION = r'''
"""A stand-in for the looseversion package (not installed here): distutils' LooseVersion ordering."""
import re

_COMPONENT = re.compile(r"(\d+|[a-z]+|\.)", re.I)


class LooseVersion:
    def __init__(self, vstring=None):
        self.vstring = str(vstring)
        parts = [p for p in _COMPONENT.split(self.vstring) if p and p != "."]
        self.version = [int(p) if p.isdigit() else p for p in parts]

    def _cmp(self, other):
        other = other if isinstance(other, LooseVersion) else LooseVersion(other)
        a, b = self.version, other.version
        return (a > b) - (a < b)

    def __eq__(self, other): return self._cmp(other) == 0
    def __lt__(self, other): return self._cmp(other) < 0
    def __le__(self, other): return self._cmp(other) <= 0
    def __gt__(self, other): return self._cmp(other) > 0
    def __ge__(self, other): return self._cmp(other) >= 0
    def __str__(self): return self.vstring
    def __repr__(self): return f"LooseVersion({self.vstring!r})"
'''


# -- notebooks -----------------------------------------------------------------------------------------


def notebook_to_script(path: Path) -> str:
    """The code cells of a notebook as one script: shell (`!`) and magic (`%`) lines dropped."""
    doc = json.loads(path.read_text())
    cells = []
    for cell in doc.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        lines = []
        for line in src.splitlines():
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")) or stripped.startswith("get_ipython()"):
                lines.append(line[: len(line) - len(stripped)] + "pass  # (notebook shell/magic line dropped)")
            else:
                lines.append(line)
        cells.append("\n".join(lines))
    return "\n\n".join(cells) + "\n"


# -- running -----------------------------------------------------------------------------------------------


def prepare(src: Path, work: Path) -> list[str]:
    """Copy and rewrite; returns the problems (leftover imports), [] when clean."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(src / "test" / "python", work / "test" / "python")
    problems = []
    for f in sorted((work / "test" / "python").rglob("*.py")):
        text = rewrite_imports(f.read_text())
        f.write_text(text)
        problems += [f"{f.relative_to(work)}: {line}" for line in leftover_imports(text)]
    (work / "test" / "python" / "nvfe_sample_plugin.py").write_text(PLUGIN)
    (work / "test" / "python" / "nvfe_fake_cuda.py").write_text(FAKE_CUDA)
    (work / "test" / "python" / "nvfe_cpu.py").write_text(CPU)
    shim = work / "shim"
    shim.mkdir()
    try:
        import looseversion  # noqa: F401
    except ImportError:
        (shim / "looseversion.py").write_text(LOOSEVERSION)
    nb_dir = work / "samples" / "python"
    nb_dir.mkdir(parents=True)
    for nb in sorted((src / "samples" / "python").glob("*.ipynb")):
        script = rewrite_imports(notebook_to_script(nb))
        problems += [f"{nb.name}: {line}" for line in leftover_imports(script)]
        (nb_dir / (nb.stem + ".py")).write_text(script)
    return problems


def _env(work: Path, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(work / "test" / "python"), str(work / "shim")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env["NVFE_MHAS_SAMPLE"] = str(args.mhas_sample)
    env["NVFE_SHARD"] = args.shard
    if args.engines:
        env["OPGRAPH_CUDNN_ENGINES"] = args.engines
    return env


def _junit_counts(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    reasons: dict[str, collections.Counter] = {"failed": collections.Counter(), "skipped": collections.Counter()}
    if not path.exists():
        return {**counts, "reasons": {}}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {c.tag: c for c in case}
        if "failure" in tags or "error" in tags:
            node = tags.get("failure", tags.get("error"))
            kind = "failed" if "failure" in tags else "errors"
            counts[kind] += 1
            msg = (node.get("message") or node.text or "").strip().splitlines()
            reasons["failed"][(msg[0] if msg else "?")[:160]] += 1
        elif "skipped" in tags:
            counts["skipped"] += 1
            reasons["skipped"][(tags["skipped"].get("message") or "")[:160]] += 1
        else:
            counts["passed"] += 1
    return {**counts, "reasons": {k: v.most_common(12) for k, v in reasons.items()}}


def run_tests(work: Path, out: Path, files: list[str], args: argparse.Namespace, deadline: float) -> dict:
    results = {}
    cwd = work / "test" / "python"
    for name in files:
        left = deadline - time.time()
        if left < 20:
            results[name] = {"note": "not run: out of time"}
            continue
        stem = Path(name).stem + ("" if args.shard == "0/1" else "_" + args.shard.replace("/", "of"))
        junit = out / f"junit_{stem}.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            name,
            "-p",
            "nvfe_sample_plugin",
            "-p",
            "no:cacheprovider",
            "-o",
            "console_output_style=classic",
            f"--junitxml={junit}",
            "-rfEs",
            "--tb=line",
        ]
        if args.fake_cuda or args.cpu:
            cmd[3:3] = ["-p", "nvfe_cpu" if args.cpu else "nvfe_fake_cuda"]
        if args.k:
            cmd += ["-k", args.k]
        if args.collect_only:
            cmd += ["--collect-only", "-q"]
        else:
            cmd += [f"--timeout={args.timeout}"]
            if args.jobs > 1:
                cmd += ["-n", str(args.jobs)]
        t0 = time.time()
        with open(out / f"{stem}.log", "w") as log:
            try:
                rc = subprocess.run(
                    cmd, cwd=cwd, env=_env(work, args), stdout=log, stderr=subprocess.STDOUT, timeout=max(10, left - 10)
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        entry = {"rc": rc, "seconds": round(time.time() - t0, 1)}
        if args.collect_only:
            text = (out / f"{stem}.log").read_text()
            m = re.search(r"(\d+)(?:/\d+)? tests? collected|(\d+) selected", text)
            found = re.findall(r"^\S+\.py::\S+", text, re.M)
            entry.update(
                collected=len(found),
                summary=text.strip().splitlines()[-1:] if text.strip() else [],
                errors=text.count("ERROR collecting"),
                matched=bool(m),
            )
        else:
            entry.update(_junit_counts(junit))
        results[stem] = entry
    return results


def run_samples(work: Path, out: Path, args: argparse.Namespace, deadline: float) -> dict:
    results = {}
    nb_dir = work / "samples" / "python"
    for num in args.notebooks.split(",") if args.notebooks else NOTEBOOKS:
        matches = sorted(nb_dir.glob(f"{num}_*.py"))
        if not matches:
            results[num] = {"result": "missing"}
            continue
        script = matches[0]
        left = deadline - time.time()
        if left < 20:
            results[script.stem] = {"result": "not run: out of time"}
            continue
        cmd = [sys.executable, "-m", "py_compile", script.name] if args.collect_only else [sys.executable, script.name]
        if args.cpu and not args.collect_only:
            cmd = [
                sys.executable,
                "-c",
                f"import nvfe_cpu, runpy; runpy.run_path({script.name!r}, run_name='__main__')",
            ]
        t0 = time.time()
        try:
            proc = subprocess.run(
                cmd,
                cwd=nb_dir,
                env=_env(work, args),
                capture_output=True,
                text=True,
                timeout=min(args.sample_timeout, max(10, left - 10)),
            )
            ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr).strip().splitlines()[-12:]
        except subprocess.TimeoutExpired:
            ok, tail = False, ["timeout"]
        (out / f"sample_{script.stem}.log").write_text("\n".join(tail) + "\n")
        results[script.stem] = {
            "result": "ok" if ok else "failed",
            "seconds": round(time.time() - t0, 1),
            "last": "" if ok else (tail[-1] if tail else ""),
        }
    return results


def table(tests: dict, samples: dict, collect_only: bool) -> str:
    lines = ["# NVIDIA cudnn-frontend tests and samples against opgraph.cudnn", ""]
    if tests:
        if collect_only:
            lines += ["| file | collected | collection errors | rc |", "|---|---|---|---|"]
            lines += [
                f"| {k} | {v.get('collected', '-')} | {v.get('errors', '-')} | {v.get('rc', '-')} |"
                for k, v in tests.items()
            ]
        else:
            lines += [
                "| file | passed | failed | errors | skipped | pass rate (not skipped) | seconds |",
                "|---|---|---|---|---|---|---|",
            ]
            for k, v in tests.items():
                if "passed" not in v:
                    lines.append(f"| {k} | {v.get('note', v.get('rc'))} | | | | | |")
                    continue
                ran = v["passed"] + v["failed"] + v["errors"]
                rate = f"{100.0 * v['passed'] / ran:.1f}%" if ran else "-"
                lines.append(
                    f"| {k} | {v['passed']} | {v['failed']} | {v['errors']} | {v['skipped']} | {rate} | "
                    f"{v['seconds']} |"
                )
        lines.append("")
    if samples:
        lines += ["| notebook | result | seconds | last line |", "|---|---|---|---|"]
        lines += [
            f"| {k} | {v['result']} | {v.get('seconds', '')} | {v.get('last', '')[:120]} |" for k, v in samples.items()
        ]
        lines.append("")
    for k, v in tests.items():
        for kind in ("failed", "skipped"):
            rs = v.get("reasons", {}).get(kind)
            if rs:
                lines += [f"## {k}: most frequent {kind} reasons", ""] + [f"- {n} x {r}" for r, n in rs] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=str(REPO / ".nvfe"), help="the carried copy (default .nvfe/)")
    p.add_argument("--work", default=os.environ.get("NVFE_WORK", "/tmp/nvfe_work"))
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/nvfe_out"))
    p.add_argument("--parts", default="mhas,v2,thd,chunked,flexible,kernel_cache,samples")
    p.add_argument(
        "--mhas-sample",
        type=int,
        default=4000,
        help="test ids of test_mhas.py to run (about 3 in 4 skip by the test's own combination rules)",
    )
    p.add_argument("--shard", default="0/1", help="i/n: the i-th of n shards of each file's tests")
    p.add_argument("--jobs", type=int, default=8, help="pytest-xdist workers (1: none)")
    p.add_argument("--timeout", type=int, default=180, help="seconds per test (pytest-timeout)")
    p.add_argument("--sample-timeout", type=int, default=240, help="seconds per notebook")
    p.add_argument("--budget", type=float, default=560, help="seconds for the whole run")
    p.add_argument("--engines", default="", help="OPGRAPH_CUDNN_ENGINES for the run (default: opgraph's choice)")
    p.add_argument("--collect-only", action="store_true")
    p.add_argument("--fake-cuda", action="store_true", help="(with --collect-only, on a machine without a GPU)")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="run the tests with their CUDA tensors on the CPU (a plumbing check, not an acceptance run)",
    )
    p.add_argument("-k", default="", help="pytest -k expression (a subset)")
    p.add_argument("--notebooks", default="", help="numbers of the notebooks to run, e.g. 01,26 (default: all)")
    args = p.parse_args(argv)
    deadline = time.time() + args.budget
    src, work, out = Path(args.src), Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (src / "test" / "python").is_dir():
        print(f"no NVIDIA tests under {src}/test/python: carry them in .nvfe/ (see the docstring)", file=sys.stderr)
        return 2
    problems = prepare(src, work)
    if problems:
        print(
            "imports of the real cudnn frontend are left after the rewrite:\n  " + "\n  ".join(problems),
            file=sys.stderr,
        )
        return 3
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    files = [f for part in parts if part in TEST_PARTS for f in TEST_PARTS[part]]
    tests = run_tests(work, out, files, args, deadline) if files else {}
    samples = run_samples(work, out, args, deadline) if "samples" in parts else {}
    report = table(tests, samples, args.collect_only)
    suffix = "" if args.shard == "0/1" else "_" + args.shard.replace("/", "of")
    (out / f"nvfe_results{suffix}.md").write_text(report)
    (out / f"nvfe_results{suffix}.json").write_text(json.dumps({"tests": tests, "samples": samples}, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
