"""By-reference buffers: kernels that read a buffer's address from the plan's address table.

Every template names its buffer parameters and passes them positionally; this rewrite applies to
any of them. For each launch, the parameters of by-reference buffers leave the signature, one
`og_table` parameter (the plan's int64 table) joins it, and the body starts by loading each address:

    p7 = tl.load(og_table + 2).to(tl.pointer_type(tl.float16))

so a new address in the table redirects the next launch, including launches replayed from a captured
CUDA graph. Addresses written to the table are checked for 16-byte alignment, which the loaded
pointers are declared to have (Triton cannot infer it from a load, and vector loads need it).

A host-side TMA descriptor of such a buffer (ArgKind.DESC, encoded at bind: it would hold the address
of the bind) becomes a descriptor the kernel makes from the table's address, with the same shape,
strides and block:

    desc_A = tl.make_tensor_descriptor(tl.multiple_of(tl.load(og_table + 2).to(...), 16) + 64, ...)

(device-side descriptors take Triton's global scratch at launch: the "needs_allocator" note).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import replace

from ...core.dtypes import DataType
from .expr import TL_DTYPE
from .templates.base import Arg, ArgKind, Generated, Launch

TABLE_PARAM = "og_table"


def make_indirect(generated: Generated, slots: Mapping[int, tuple[int, DataType]]) -> Generated:
    """`generated` with the buffers in `slots` ({uid: (table slot, data type)}) read by reference."""
    if not any(a.kind in ("buf", "desc") and a.uid in slots for l in generated.launches for a in l.args):
        return generated
    source = generated.source
    lines = source.splitlines()
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, replacement), 1-based
    launches: list[Launch] = []
    done: dict[str, tuple[Arg, ...]] = {}
    device_descriptors = False
    for launch in generated.launches:
        if launch.kernel in done:
            launches.append(replace(launch, args=done[launch.kernel]))
            continue
        refs = [i for i, a in enumerate(launch.args) if a.kind in ("buf", "desc") and a.uid in slots]
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
            arg = launch.args[i]
            slot, dtype = slots[arg.uid]
            pointer = f"tl.load({TABLE_PARAM} + {slot}).to(tl.pointer_type({TL_DTYPE[dtype]}))"
            if arg.kind == "desc":
                base = f"tl.multiple_of({pointer}, 16)" + (f" + {arg.offset}" if arg.offset else "")
                loads.append(
                    f"{body_indent}{name} = tl.make_tensor_descriptor({base}, shape={list(arg.shape)}, "
                    f"strides={list(arg.strides)}, block_shape={list(arg.block)})"
                )
                device_descriptors = True
                continue
            loads.append(f"{body_indent}{name} = {pointer}")
            loads.append(f"{body_indent}{name} = tl.multiple_of({name}, 16)")
        edits.append((fn.lineno, fn.body[0].lineno - 1, [header, *loads]))
        args = tuple(a for i, a in enumerate(launch.args) if i not in refs) + (Arg(ArgKind.TABLE),)
        done[launch.kernel] = args
        launches.append(replace(launch, args=args))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1 : last] = replacement
    notes = generated.notes | {"needs_allocator"} if device_descriptors else generated.notes
    return replace(generated, source="\n".join(lines) + "\n", launches=tuple(launches), notes=notes)
