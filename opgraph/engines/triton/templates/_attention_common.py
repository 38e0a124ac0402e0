"""What the attention templates share: matching an sdpa / sdpa_backward piece, its spec, the knob
candidates fitted to the device, notes and generation. `attention.py` and `attention_bwd.py` give the
op kind, the knob names and the kernel builder (opgraph.engines.triton.attention)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.errors import InternalError
from ....core.piece import Piece
from ..attention.generated import launches_of
from ..attention.lowering import analyze, build_spec, support_of
from .base import Generated, Template, unique


class AttentionTemplateBase(Template):
    kind: ClassVar[str]  # the op kind the template runs (one per piece)
    KNOBS: ClassVar[tuple[str, ...]]  # the knob names of the kernel builder's knob class
    priority = 60

    # the kernel builder's parts: knob candidates for (D, cuda, Dv), fitting one to the device's shared
    # memory (None: it does not fit), the knob class, and the builder of the kernels' source
    candidates_for: ClassVar[Callable[..., Any]]
    fit: ClassVar[Callable[..., Any]]
    knob_class: ClassVar[type]
    build: ClassVar[Callable[..., Any]]

    def match(self, piece: Piece, device: Device) -> Support:
        f = analyze(piece, self.kind, self.name)
        if isinstance(f, Support):
            return f
        return support_of(piece, f, self.name)

    def _spec(self, piece: Piece, device: Device, knobs: Mapping[str, Any] | None = None) -> Any:
        f = analyze(piece, self.kind, self.name)
        if isinstance(f, Support):
            raise InternalError(f"{self.name}: a spec of a piece it does not match ({f.reason})",
                                rule="internal.invariant", hint="this is an opgraph bug: please report it")
        precision = str((knobs or {}).get("fp32_precision", "ieee"))
        return build_spec(piece, f, interpret=not device.is_cuda, fp32_precision=precision)

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        spec = self._spec(piece, device)
        out = []
        for k in self.candidates_for(spec.D, cuda=device.is_cuda, dv=spec.Dv, scored=spec.score_mod is not None):
            fitted = self.fit(spec, k) if device.is_cuda else k
            if fitted is not None:
                out.append({n: getattr(fitted, n) for n in self.KNOBS})
        if spec.q.dtype == "tl.float32" and device.is_cuda:
            out.append({**out[0], "fp32_precision": "tf32"})
        return unique(out)

    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        if knobs.get("fp32_precision") == "tf32":
            return frozenset({NumericalNote.TENSOR_CORE, NumericalNote.DOWN_CONVERT_INPUTS})
        return frozenset({NumericalNote.TENSOR_CORE})

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        spec = self._spec(piece, device, knobs)
        kn = self.knob_class(**{n: int(knobs[n]) for n in self.KNOBS if n in knobs})
        return launches_of(self.build(spec, kn))
