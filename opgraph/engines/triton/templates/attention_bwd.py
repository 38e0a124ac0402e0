"""sdpa_backward as the generated flash-attention backward (opgraph/engines/triton/attention):
a preprocess launch (delta = rowsum(dO * O)), then dK/dV programs over key blocks (GQA groups summed
in-program, dBias written from dS) and dQ programs over query blocks, recomputing P from Stats;
deterministic (no atomics), whatever use_deterministic_algorithm says. A dBias that broadcasts is
summed from fp32 partials in scratch by a last launch.

What a piece may hold: the sdpa_backward node alone. Layout and types as the forward template's
(unit last stride of q, k, v, o, dO and the gradients); as many key heads as value heads.

Knobs: dK/dV tiles BLOCK_M1 (query rows a step) x BLOCK_N1 (keys a program) with W1 warps and S1
stages; dQ tiles BLOCK_M2 x BLOCK_N2 with W2, S2; FUSED (one launch for both kinds of programs),
ONELOOP, TMA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.piece import Piece
from ..attention import BwdKnobs, backward
from ..attention.generated import launches_of
from ..attention.knobs import bwd_candidates, fit_bwd
from ..attention.lowering import analyze, build_spec, support_of
from .base import Generated, Template, unique

_KNOBS = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "W1", "S1", "W2", "S2", "PRE_BLOCK", "TMA", "FUSED",
          "ONELOOP")


class AttentionBackwardTemplate(Template):
    name = "attention_bwd"
    main_kinds = ("sdpa_backward",)
    priority = 60

    def match(self, piece: Piece, device: Device) -> Support:
        f = analyze(piece, "sdpa_backward", self.name)
        if isinstance(f, Support):
            return f
        return support_of(piece, f, self.name)

    def _spec(self, piece: Piece, device: Device, knobs: dict[str, Any] | None = None):
        f = analyze(piece, "sdpa_backward", self.name)
        assert not isinstance(f, Support), f.reason
        precision = str((knobs or {}).get("fp32_precision", "ieee"))
        return build_spec(piece, f, interpret=not device.is_cuda, fp32_precision=precision)

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        spec = self._spec(piece, device)
        out = []
        for k in bwd_candidates(spec.D, cuda=device.is_cuda, dv=spec.Dv):
            fitted = fit_bwd(spec, k) if device.is_cuda else k
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
        kn = BwdKnobs(**{n: int(knobs[n]) for n in _KNOBS if n in knobs})
        return launches_of(backward(spec, kn))


TEMPLATE = AttentionBackwardTemplate()
