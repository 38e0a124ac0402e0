"""What the attention templates share: matching an sdpa / sdpa_backward piece, its spec, the knob
candidates fitted to the device, notes and generation. `attention.py` and `attention_bwd.py` give the
op kind, the knob names, the kernel builder (opgraph.engines.triton.attention) and which configs
take a dynamic plan's sizes at run time (`sized_knobs`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.ir import ShapeOrigin
from ....core.piece import Piece
from ..attention.lowering import Fusion, analyze, build_spec, support_of
from ..attention.sized import sized_spec, upper
from ..gemm.template import divisible_text
from ..sizes import Sizes, bucket_analysis
from .base import Generated, Match, Template, unique


class AttentionTemplateBase(Template):
    kind: ClassVar[str]  # the op kind the template runs (one per piece)
    priority = 60

    # the kernel builder's parts: knob candidates for (D, cuda, Dv), fitting one to the device (spec, knobs,
    # skv=the KV length at the bucket's largest shape; None: it does not fit), and the builder of the
    # kernels' source
    candidates_for: ClassVar[Callable[..., Any]]
    fit: ClassVar[Callable[..., Any]]
    more_candidates: ClassVar[Callable[..., Any] | None] = None  # (spec, cuda=, skv=) -> knobs after the others
    build: ClassVar[Callable[..., Any]]

    def sized_knobs(self, knobs: Any) -> bool:
        """Whether a config's kernels can take a dynamic plan's sizes at run time (the others are
        generated at each shape of the bucket with the bucket's knobs): none by default."""
        return False

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
        extra = list(t.more_candidates(spec, cuda=cuda, skv=self.largest_skv)) if t.more_candidates else []
        for k in knobs + extra:
            if getattr(k, "TILES", None) and self.symbolic is not None:
                continue  # (a bucket's kernel takes its batch and lengths at run time: no tile list)
            fitted = t.fit(spec, k, skv=self.largest_skv) if cuda else k
            if fitted is not None:
                out.append(fitted)
        if spec.q.dtype == "tl.float32" and cuda:
            out.append(out[0].replace(fp32_precision="tf32"))
        return unique(out)

    def notes(self, knobs: Any) -> frozenset[NumericalNote]:
        if knobs.fp32_precision == "tf32":
            return frozenset({NumericalNote.TENSOR_CORE, NumericalNote.DOWN_CONVERT_INPUTS})
        return frozenset({NumericalNote.TENSOR_CORE})

    @cached_property
    def symbolic(self) -> tuple[Piece, Fusion, ShapeOrigin] | None:
        """The piece's symbolic origin and its analysis where the piece is of a dynamic plan's bucket and
        has a dynamic size (its kernels may then take the sizes at run time: ../sizes.py); else None."""
        return bucket_analysis(
            self.piece, lambda p: analyze(p, self.template.kind, self.template.name), dynamic_io=True
        )

    @cached_property
    def largest_skv(self) -> int:
        """The piece's KV length at the largest shape of its bucket (its own outside a dynamic plan, or
        where the KV length is static or cannot be read symbolically)."""
        own = self.spec().Skv
        try:
            spec = self._sized_spec("ieee")
        except TypeError:  # (a decision on a dynamic size while building the spec)
            return own
        return own if spec is None else max(own, upper(spec.Skv))

    def _sized_spec(self, fp32_precision: str) -> Any:
        """The spec of the piece's symbolic origin, its dynamic sizes `sized.Size`s of a fresh `Sizes` (a
        kernel's own: the parameters are named in the order it uses them); None outside a bucket. Raises
        TypeError where building it decides by a dynamic size."""
        if self.symbolic is None:
            return None
        piece, f, origin = self.symbolic
        sizes = Sizes(origin)
        spec = build_spec(piece, f, interpret=self.interpret, fp32_precision=fp32_precision, text=divisible_text(sizes))
        return sized_spec(spec, sizes)

    def sized(self, knobs: Any) -> Generated | None:
        """The bucket's kernels of a config, taking the dynamic sizes at run time (one source for every
        shape of the bucket), where the piece (`symbolic`), the config (the template's `sized_knobs`) and
        the generator allow; None: generated at the piece's shape."""
        if self.symbolic is None or not self.template.sized_knobs(knobs):
            return None
        try:
            spec = self._sized_spec(knobs.fp32_precision or "ieee")
            generated = self.template.build(spec, knobs)
        except TypeError:  # a decision on a dynamic size (sized.Size): generated at the shape
            return None
        return generated if generated.sized else None

    def generate(self, knobs: Any) -> Generated:
        return self.sized(knobs) or self.template.build(self.spec(knobs.fp32_precision), knobs)
