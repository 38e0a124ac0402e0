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
FLOAT (fp32 dots as IEEE fp32 by default, tf32 as a knob). Packed (ragged, THD) q, k, v, O and Stats,
paged k and v (page tables, packed ones too), the diagonal band's right bound and bottom-right alignment (no
prologue or epilogue on a packed or paged tensor), sinks, the score_max / score_sum_exp outputs and
-inf Stats, the rng_dump output, block masks.

Knobs: BLOCK_M x BLOCK_N tiles, num_warps, num_stages, TMA (tensor-descriptor reads), ORDER (grid
order), ONELOOP (one loop with run-time masks), SPLIT (split-KV: the keys of each query block over
SPLIT programs and a combining launch), PACK_GQA (GQA head packing: a program per key/value head, its
tile's rows the group's query heads times the queries); both offered for decode-shaped problems and
put first by the build's policy (opgraph/build/split_kv.py, gqa_pack.py); candidates per head dim in
attention/knobs.py, with stages cut where the tiles would not fit shared memory.
"""

from __future__ import annotations

from ..attention import FwdKnobs, forward
from ..attention.knobs import decode_candidates, fit_fwd, fwd_candidates
from ._attention_common import AttentionTemplateBase


class AttentionTemplate(AttentionTemplateBase):
    name = "attention"
    kind = "sdpa"
    main_kinds = ("sdpa",)
    candidates_for = staticmethod(fwd_candidates)
    more_candidates = staticmethod(decode_candidates)
    fit = staticmethod(fit_fwd)
    knob_class = FwdKnobs
    build = staticmethod(forward)


TEMPLATE = AttentionTemplate()
