"""By-reference buffers: kernels that read a buffer's address from the plan's address table.

Every template names its buffer parameters and passes them positionally; this rewrite applies to
any of them. For each launch, the parameters of by-reference buffers leave the signature, one
`og_table` parameter (the plan's int64 table) joins it, and the body starts by loading each address:

    p7 = tl.load(og_table + 2).to(tl.pointer_type(tl.float16))

so a new address in the table redirects the next launch, including launches replayed from a captured
CUDA graph. Addresses written to the table are checked for 16-byte alignment, which the loaded
pointers are declared to have (Triton cannot infer it from a load, and vector loads need it).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Mapping

from ...dtypes import DataType
from .expr import TL_DTYPE
from .templates.base import Arg, Generated, Launch

TABLE_PARAM = "og_table"


def make_indirect(generated: Generated, slots: Mapping[int, tuple[int, DataType]]) -> Generated:
    """`generated` with the buffers in `slots` ({uid: (table slot, data type)}) read by reference."""
    if not any(a.kind == "buf" and a.uid in slots for l in generated.launches for a in l.args):
        return generated
    source = generated.source
    lines = source.splitlines()
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, replacement), 1-based
    launches: list[Launch] = []
    done: dict[str, tuple[Arg, ...]] = {}
    for launch in generated.launches:
        if launch.kernel in done:
            launches.append(replace(launch, args=done[launch.kernel]))
            continue
        refs = [i for i, a in enumerate(launch.args) if a.kind == "buf" and a.uid in slots]
        if not refs:
            launches.append(launch)
            continue
        fn = functions[launch.kernel]
        params = fn.args.args
        nrt = len(launch.args)
        kept = [ast.unparse(p) for i, p in enumerate(params[:nrt]) if i not in refs]
        tail = [ast.unparse(p) for p in params[nrt:]]
        header = f"def {fn.name}({', '.join([*kept, TABLE_PARAM, *tail])}):"
        body_indent = " " * fn.body[0].col_offset
        loads = []
        for i in refs:
            name = params[i].arg
            slot, dtype = slots[launch.args[i].uid]
            loads.append(f"{body_indent}{name} = tl.load({TABLE_PARAM} + {slot}).to(tl.pointer_type({TL_DTYPE[dtype]}))")
            loads.append(f"{body_indent}{name} = tl.multiple_of({name}, 16)")
        edits.append((fn.lineno, fn.body[0].lineno - 1, [header, *loads]))
        args = tuple(a for i, a in enumerate(launch.args) if i not in refs) + (Arg("table"),)
        done[launch.kernel] = args
        launches.append(replace(launch, args=args))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1:last] = replacement
    return replace(generated, source="\n".join(lines) + "\n", launches=tuple(launches))
