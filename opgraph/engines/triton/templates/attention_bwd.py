"""sdpa_backward as the generated flash-attention backward (opgraph/engines/triton/attention):
a preprocess launch (delta = rowsum(dO * O)), then dK/dV programs over key blocks (GQA groups summed
in-program, dBias written from dS) and dQ programs over query blocks, recomputing P from Stats;
deterministic (no atomics), whatever use_deterministic_algorithm says. A dBias that broadcasts is
summed from fp32 partials in scratch by a last launch.

What a piece may hold: the sdpa_backward node alone. Layout and types as the forward template's
(unit last stride of q, k, v, o, dO and the gradients); as many key heads as value heads. Packed
(ragged) tensors, the diagonal band, sinks (dSink_token) and block masks as the forward
(attention/lowering.py `RUNS`).

Knobs: dK/dV tiles BLOCK_M1 (query rows a step) x BLOCK_N1 (keys a program) with W1 warps and S1
stages; dQ tiles BLOCK_M2 x BLOCK_N2 with W2, S2; FUSED (one launch for both kinds of programs),
ONELOOP, TMA; TILES (packed sequences walked as lists of their own key and query blocks,
attention/tiles.py: offered after the others).

In a dynamic plan's bucket (../sizes.py, as the forward template) the launches take batch, Sq, Skv
and the strides they set at run time (one source for the bucket), delta's scratch laid out for the
bucket's largest shape (Generated.bucket_scratch) and indexed by the run-time sizes; packed (ragged)
tensors too, their token count a size argument. Generated at each shape, as before: TMA configs, a dBias
that broadcasts (its partials' reduction), and anything the generator decides by a dynamic size.
"""

from __future__ import annotations

from typing import Any

from ..attention import BwdKnobs, backward
from ..attention.knobs import bwd_candidates, fit_bwd, tile_bwd_candidates
from ._attention_common import AttentionTemplateBase


class AttentionBackwardTemplate(AttentionTemplateBase):
    name = "attention_bwd"
    kind = "sdpa_backward"
    main_kinds = ("sdpa_backward",)
    candidates_for = staticmethod(bwd_candidates)
    more_candidates = staticmethod(tile_bwd_candidates)
    fit = staticmethod(fit_bwd)
    knob_class = BwdKnobs
    build = staticmethod(backward)

    def sized_knobs(self, knobs: Any) -> bool:
        return not knobs.TMA and not knobs.TILES


TEMPLATE = AttentionBackwardTemplate()
