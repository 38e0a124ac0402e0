"""sdpa as a generated flash-attention forward (opgraph/engines/triton/attention: FlashAttention-2
structure, online softmax in fp32, tensor-core dots, fully masked key blocks skipped), with
pointwise prologues on q, k and v (computed on each tile from their own inputs: a scale, rotary
tables, a cast) and a pointwise epilogue on O fused in; the masks, bias, ALiBi, dropout and the
score modifier are emitted into the tile loop.

What a piece may hold: one sdpa node; pointwise nodes that only feed q, k or v (each node one
operand's, its tensors broadcast to that operand's dims; none of its values needed outside the
piece); pointwise nodes on O (tensors broadcast to O's dims; outputs of O's dims). Not Stats
consumers, not prologue values read by the epilogue. Layout: q/k/v read from memory and O written
with a unit last stride (BSHD, BHSD or any other strides); head dims up to 256; HALF, BFLOAT16 or
FLOAT (fp32 dots as IEEE fp32 by default, tf32 as a knob).

Knobs: BLOCK_M x BLOCK_N tiles, num_warps, num_stages, TMA (tensor-descriptor reads), ORDER (grid
order), ONELOOP (one loop with run-time masks); candidates per head dim in attention/knobs.py, with
stages cut where the tiles would not fit shared memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.piece import Piece
from ..attention import FwdKnobs, forward
from ..attention.generated import launches_of
from ..attention.knobs import fit_fwd, fwd_candidates
from ..attention.lowering import analyze, build_spec, support_of
from .base import Generated, Template, unique

_KNOBS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA", "ORDER", "ONELOOP")


class AttentionTemplate(Template):
    name = "attention"
    main_kinds = ("sdpa",)
    priority = 60

    def match(self, piece: Piece, device: Device) -> Support:
        f = analyze(piece, "sdpa", self.name)
        if isinstance(f, Support):
            return f
        return support_of(piece, f, self.name)

    def _spec(self, piece: Piece, device: Device, knobs: dict[str, Any] | None = None):
        f = analyze(piece, "sdpa", self.name)
        assert not isinstance(f, Support), f.reason
        precision = str((knobs or {}).get("fp32_precision", "ieee"))
        return build_spec(piece, f, interpret=not device.is_cuda, fp32_precision=precision)

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        spec = self._spec(piece, device)
        out = []
        for k in fwd_candidates(spec.D, cuda=device.is_cuda, dv=spec.Dv):
            fitted = fit_fwd(spec, k) if device.is_cuda else k
            if fitted is not None:
                out.append({n: getattr(fitted, n) for n in _KNOBS})
        if spec.q.dtype == "tl.float32" and device.is_cuda:
            out.append({**out[0], "fp32_precision": "tf32"})
        return unique(out)

    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        if knobs.get("fp32_precision") == "tf32":
            return frozenset({NumericalNote.TENSOR_CORE, NumericalNote.DOWN_CONVERT_INPUTS})
        return frozenset({NumericalNote.TENSOR_CORE})

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        spec = self._spec(piece, device, knobs)
        kn = FwdKnobs(**{n: int(knobs[n]) for n in _KNOBS if n in knobs})
        return launches_of(forward(spec, kn))


TEMPLATE = AttentionTemplate()
