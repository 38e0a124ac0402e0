"""A conv template's image prologue run as its own pass first (knob PROLOGUE_PASS=1).

conv_fprop and conv_wgrad load the image tile once per filter tap, so a prologue fused on the image
(SBR's scale + bias + relu of a training-mode batchnorm) runs R*S times on every element, in the
registers of the tensor-core loop. The pass variant runs the prologue once, as the pointwise template's
kernel writing the conv's input into the step's scratch memory, then the template's plain kernel over
it: two launches of one step, the piece and its fusion unchanged (another engine may still take the
fused piece whole). Measured 2026-11-26 on an H100 (bf16, N32 C64 56², 3x3): the fused wgrad took
64.6 µs, the same wgrad without a prologue 30.5, and the pass moves 25.7 MB (about 11 µs at the measured
copy rate); the fused conv + genstats 56.6, a plain conv + bias + relu of that shape 29.7. On the GPU a
conv with more than one tap therefore tries the pass variants first (not yet measured as such); the
tuner times both kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from ....core.device import Device
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.piece import Piece, make_piece
from ....memory.workspace import align_up
from ..gemm import TileTemplate
from ..gemm.tuning import BANDWIDTH
from .base import Arg, ArgKind, Generated, Launch, Template
from .pointwise import PointwiseTemplate

if TYPE_CHECKING:
    from ..gemm import GemmPiece

KNOB = "PROLOGUE_PASS"
TEMPLATES = ("conv_fprop", "conv_wgrad")  # the templates whose candidates offer it
_POINTWISE = PointwiseTemplate()
_KERNEL = "kernel_prologue_pass"  # (the loader jits the functions named kernel*)
_PASS_CONFIGS = 3  # the plain conv's best configs offered with the pass
_IMAGE_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def _split(template: TileTemplate, piece: Piece, gp: GemmPiece,
           device: Device) -> tuple[Piece, Piece, int] | None:
    """(the prologue's piece, the rest of the piece, the conv input the prologue computes), or None
    where the image has no prologue the pointwise template and the conv template can run apart: none
    at all, one that reads a view computed in the piece (a slice of X), an image type other than
    fp16 / bf16 / fp32 (fp8's padding loads are rewritten for buffers, not scratch)."""
    uid = gp.main.input("image")
    if not isinstance(uid, int):
        return None
    nodes = gp.prologue.get(uid)
    if not nodes or piece.tensor(uid).data_type not in _IMAGE_TYPES:
        return None
    members = {id(n) for n in nodes}
    pre = make_piece(piece.graph, piece.index, list(nodes))
    rest = make_piece(piece.graph, piece.index, [n for n in piece.nodes if id(n) not in members])
    if (tuple(pre.outputs) != (uid,) or not set(pre.inputs) <= set(piece.inputs)
            or not _POINTWISE.match(pre, device).ok or template.analyze(rest)[0] is None):
        return None
    return pre, rest, uid


def _runs_it(template: Template) -> TypeGuard[TileTemplate]:
    return isinstance(template, TileTemplate) and template.name in TEMPLATES


def _plain(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The conv kernel's own knobs (without the pass's)."""
    return {k: v for k, v in knobs.items() if k != KNOB}


def candidates(template: TileTemplate, piece: Piece, gp: GemmPiece, configs: list[dict[str, Any]],
               device: Device, taps: int) -> list[dict[str, Any]]:
    """`configs` (the fused kernel's, the heuristic's first) with the pass variants: the plain conv's best
    configs with PROLOGUE_PASS=1, first on the GPU when the filter has more than one tap, otherwise
    before the last fused one (the broadest, FALLBACK's pick, stays last; the tuner and the tests reach
    them)."""
    parts = _split(template, piece, gp, device)
    if parts is None:
        return configs
    plain = template.candidates(parts[1], device)
    limit = _PASS_CONFIGS if device.is_cuda else 1
    passes = [{**c, KNOB: 1} for c in plain[:limit]]
    return passes + configs if device.is_cuda and taps > 1 else configs[:-1] + passes + configs[-1:]


def estimate(template: Template, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
    """The plain kernel's estimate plus the pass: the prologue's inputs read and the conv input written
    once, at the bandwidth the GEMM estimates assume."""
    if not _runs_it(template):
        return None
    gp, _ = template.analyze(piece)
    parts = None if gp is None else _split(template, piece, gp, device)
    if parts is None:
        return None
    pre, rest, _ = parts
    plain = template.estimate(rest, _plain(knobs), device)
    if plain is None:
        return None
    moved = sum(pre.tensor(u).nbytes for u in (*pre.inputs, *pre.outputs))
    return plain + moved / BANDWIDTH * 1e6 + 3.0


def generate(template: Template, piece: Piece, knobs: Mapping[str, Any], device: Device) -> Generated:
    """The pointwise pass writing the conv's input into scratch (after the kernel's own scratch), then
    the template's kernel reading it there."""
    if not _runs_it(template):
        raise AttributeValueError(f"{KNOB} is a knob of the {' and '.join(TEMPLATES)} templates, not of "
                                  f"{template.name}", op=piece.nodes[0].label(), rule="triton.conv.prologue_pass",
                                  hint=f"drop {KNOB} from this config")
    gp = template.analyzed(piece)
    parts = _split(template, piece, gp, device)
    if parts is None:
        raise AttributeValueError(f"{KNOB}=1 needs a pointwise prologue on the image of {gp.main.label()} that "
                                  "can run apart (on fp16, bf16 or fp32 values, reading no view of the piece)",
                                  op=gp.main.label(), rule="triton.conv.prologue_pass",
                                  hint=f"drop {KNOB} (this piece's image has no prologue to run apart)")
    pre, rest, uid = parts
    main = template.generate(rest, _plain(knobs), device)
    first = _POINTWISE.generate(pre, dict(_POINTWISE.candidates(pre, device)[0]), device)
    assert first.scratch_bytes == 0 and all(l.kernel == "kernel" for l in first.launches)
    offset = align_up(main.scratch_bytes)
    desc = piece.tensor(uid)
    into = Arg(ArgKind.SCRATCH, offset=offset, dtype=str(desc.data_type.to_torch()).replace("torch.", ""))

    def redirect(launch: Launch, kernel: str) -> Launch:
        args = tuple(into if a.kind == ArgKind.BUF and a.uid == uid else a for a in launch.args)
        return Launch(kernel, launch.grid, args, launch.meta)

    source = first.source.replace("def kernel(", f"def {_KERNEL}(", 1)
    return Generated(source + "\n" + main.source,
                     tuple(redirect(l, _KERNEL) for l in first.launches)
                     + tuple(redirect(l, l.kernel) for l in main.launches),
                     offset + align_up(desc.nbytes), first.notes | main.notes)
