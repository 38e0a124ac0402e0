"""Rewrites of generated kernels that every template needs, applied to the source once it is
generated (templates name buffer parameters p{uid} and pass launch arguments positionally):

- `typed_scalars`: pass-by-value parameters declared `tl.float64`, so a DOUBLE graph's scalar keeps
  its precision (Triton types a Python float argument fp32); kernels convert it to their compute type;
  an int64 one (Arg dtype "int64": a Philox seed) `tl.int64`, so no value passes through a float;
- `fp8_fill`: masked loads of fp8 buffers fill masked-off lanes with an fp8 zero (`other=0` would
  be an int -> fp8 cast, which Triton refuses on the GPU and in its interpreter);
- `overlapped`: every launched kernel first waits for the kernel before it in the stream to finish
  (`gdc_wait`), then lets the next one launch (`gdc_launch_dependents`): launched with programmatic
  dependent launch (native.py), a kernel's launch and start overlap its predecessor's last wave
  (Hopper and newer; where it is launched plainly both instructions do nothing).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import replace

from ...core.dtypes import DataType
from .templates.base import Generated

OVERLAP = "launch_overlap"  # Generated.notes: the kernels wait for their predecessor (`overlapped`)
_WAIT = ("extra.cuda.gdc_wait()", "extra.cuda.gdc_launch_dependents()")  # (after Triton's language module)
_SCALAR_TYPE = {"int64": "tl.int64"}  # a SCALAR Arg's dtype -> its parameter's annotation (else tl.float64)
_FP8 = {DataType.FP8_E4M3: "tl.float8e4nv", DataType.FP8_E5M2: "tl.float8e5"}


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def typed_scalars(generated: Generated) -> Generated:
    if not any(a.kind == "scalar" for l in generated.launches for a in l.args):
        return generated
    lines = generated.source.splitlines()
    functions = _functions(generated.source)
    edits: dict[int, tuple[int, str]] = {}
    for launch in generated.launches:
        fn = functions[launch.kernel]
        if fn.lineno in edits:
            continue
        params = fn.args.args
        rendered = [
            f"{p.arg}: {_SCALAR_TYPE.get(launch.args[i].dtype, 'tl.float64')}"
            if i < len(launch.args) and launch.args[i].kind == "scalar"
            else ast.unparse(p)
            for i, p in enumerate(params)
        ]
        edits[fn.lineno] = (fn.body[0].lineno - 1, f"def {fn.name}({', '.join(rendered)}):")
    for first, (last, header) in sorted(edits.items(), reverse=True):
        lines[first - 1 : last] = [header]
    return replace(generated, source="\n".join(lines) + "\n")


def fp8_fill(generated: Generated, types: Mapping[int, DataType]) -> Generated:
    """`types`: the data type of every buffer uid."""
    if not any(a.kind == "buf" and types.get(a.uid) in _FP8 for l in generated.launches for a in l.args):
        return generated
    fp8 = {}
    functions = _functions(generated.source)
    for launch in generated.launches:
        params = functions[launch.kernel].args.args
        for i, a in enumerate(launch.args):
            if a.kind == "buf" and types.get(a.uid) in _FP8 and i < len(params):
                fp8[(launch.kernel, params[i].arg)] = _FP8[types[a.uid]]
    if not fp8:
        return generated
    tree = ast.parse(generated.source)
    changed = False
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "tl.load" and call.args):
                continue
            names = {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)}
            kinds = {fp8[(fn.name, n)] for n in names if (fn.name, n) in fp8}
            for kw in call.keywords:
                if kw.arg == "other" and len(kinds) == 1:
                    kw.value = ast.parse(f"tl.zeros([1], {kinds.pop()})", mode="eval").body
                    changed = True
    if not changed:
        return generated
    return replace(generated, source=ast.unparse(tree) + "\n")


def overlapped(generated: Generated, gluon: bool = False) -> Generated:
    """Each launched kernel's body begins with the wait for the previous kernel in the stream, before any
    memory access (its reads of what that kernel wrote, and its writes of what it reads), then the signal
    that the next kernel may launch: the two statements a programmatic dependent launch needs. Triton
    kernels, and Gluon's where `gluon` (bound.overlap_mode; in a Gluon module Triton's language is `_og_tl`:
    gluon_prelude.py)."""
    is_gluon = "_OG_GLUON = True" in generated.source
    if not generated.launches or (is_gluon and not gluon):
        return generated
    language = "_og_tl." if is_gluon else "tl."
    lines = generated.source.split("\n")  # (and joined by it again: the source's ending kept)
    functions = _functions(generated.source)
    starts = set()
    for launch in generated.launches:
        fn = functions[launch.kernel]
        first = fn.body[1] if len(fn.body) > 1 and _is_docstring(fn.body[0]) else fn.body[0]
        indent = lines[first.lineno - 1][: first.col_offset]
        if first.lineno == fn.lineno or indent.strip():  # (no template writes a statement after other text)
            raise AssertionError(f"kernel {fn.name}: its first statement does not begin its own line")
        starts.add((first.lineno, indent))
    for line, indent in sorted(starts, reverse=True):
        lines[line - 1 : line - 1] = [indent + language + statement for statement in _WAIT]
    return replace(generated, source="\n".join(lines), notes=generated.notes | {OVERLAP})


def without_overlap(source: str) -> str:
    """The source as it was before `overlapped`."""
    if "gdc_wait()" not in source:
        return source
    return "\n".join(line for line in source.split("\n") if not line.strip().endswith(_WAIT))


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
