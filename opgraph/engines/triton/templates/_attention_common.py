"""What the attention templates share: matching an sdpa / sdpa_backward piece, its spec, the knob
candidates fitted to the device, notes and generation. `attention.py` and `attention_bwd.py` give the
op kind, the knob names and the kernel builder (opgraph.engines.triton.attention)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.piece import Piece
from ..attention.lowering import analyze, build_spec, support_of
from .base import Generated, Match, Template, unique


class AttentionTemplateBase(Template):
    kind: ClassVar[str]  # the op kind the template runs (one per piece)
    priority = 60

    # the kernel builder's parts: knob candidates for (D, cuda, Dv), fitting one to the device's shared
    # memory (None: it does not fit), and the builder of the kernels' source
    candidates_for: ClassVar[Callable[..., Any]]
    fit: ClassVar[Callable[..., Any]]
    more_candidates: ClassVar[Callable[..., Any] | None] = None  # (spec, cuda=) -> knobs after the others
    build: ClassVar[Callable[..., Any]]

    def match(self, piece: Piece, device: Device) -> Support | AttentionMatch:
        f = analyze(piece, self.kind, self.name)
        if isinstance(f, Support):
            return f
        verdict = support_of(piece, f, self.name)
        return AttentionMatch(self, piece, device, f) if verdict.ok else verdict


class AttentionMatch(Match[Any]):
    """An sdpa / sdpa_backward piece matched: its analysis, and its spec per fp32 product precision."""

    template: AttentionTemplateBase

    def __init__(self, template: AttentionTemplateBase, piece: Piece, device: Device, analysis: Any) -> None:
        super().__init__(template, piece, device)
        self.analysis = analysis
        self._specs: dict[str, Any] = {}

    def spec(self, precision: str | None = None) -> Any:
        precision = precision or "ieee"
        if precision not in self._specs:
            self._specs[precision] = build_spec(
                self.piece, self.analysis, interpret=self.interpret, fp32_precision=precision
            )
        return self._specs[precision]

    def candidates(self) -> list[Any]:
        spec, cuda = self.spec(), self.device.is_cuda
        t = self.template
        out = []
        knobs = list(t.candidates_for(spec.D, cuda=cuda, dv=spec.Dv, scored=spec.score_mod is not None))
        extra = list(t.more_candidates(spec, cuda=cuda)) if t.more_candidates is not None else []
        for k in knobs + extra:
            fitted = t.fit(spec, k) if cuda else k
            if fitted is not None:
                out.append(fitted)
        if spec.q.dtype == "tl.float32" and cuda:
            out.append(out[0].replace(fp32_precision="tf32"))
        return unique(out)

    def notes(self, knobs: Any) -> frozenset[NumericalNote]:
        if knobs.fp32_precision == "tf32":
            return frozenset({NumericalNote.TENSOR_CORE, NumericalNote.DOWN_CONVERT_INPUTS})
        return frozenset({NumericalNote.TENSOR_CORE})

    def generate(self, knobs: Any) -> Generated:
        return self.template.build(self.spec(knobs.fp32_precision), knobs)
