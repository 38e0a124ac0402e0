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
put first by the build's policy (opgraph/build/split_kv.py, gqa_pack.py); TILES (packed queries walked
as a list of their sequences' own blocks, attention/tiles.py: offered after the others); candidates per head dim in
attention/knobs.py, with stages cut where the tiles would not fit shared memory.

A piece of a dynamic plan's bucket (../sizes.py) whose batch, query or key length is dynamic gets one
kernel that takes them at run time (`AttentionMatch.sized`, attention/sized.py): those sizes, the tile
count and the strides they set are size arguments, the grid is evaluated per shape, the bounds masks
(query rows past Sq, keys past Skv) are always emitted and compare with the run-time sizes, so every
shape of the bucket runs one source and one binary; GQA packing (PACK_GQA) included, its tile rows
masked by the run-time Sq, and split-KV (SPLIT > 1, the count a knob of the bucket: the chunk length a
size argument, the partials' scratch laid out for the bucket's largest shape, the merging launch sized
too; attention/split.py); packed (ragged, THD) tensors, their token count a size argument (the packed
outputs' zeroing launch too), and paged caches, the batch setting the grid and the tables' rows. Generated
at each shape with the bucket's knobs, as before: TMA (the descriptors' shapes), and anything the
generator decides by a dynamic size (a view at a dynamic offset, an explicit dropout mask's strides).
Heads and head dims stay literals (they are never dynamic in a bucket kernel).
"""

from __future__ import annotations

from typing import Any

from ..attention import FwdKnobs, forward
from ..attention.knobs import fit_fwd, fwd_candidates, more_fwd_candidates
from ._attention_common import AttentionTemplateBase


class AttentionTemplate(AttentionTemplateBase):
    name = "attention"
    kind = "sdpa"
    main_kinds = ("sdpa",)
    candidates_for = staticmethod(fwd_candidates)
    more_candidates = staticmethod(more_fwd_candidates)
    fit = staticmethod(fit_fwd)
    knob_class = FwdKnobs
    build = staticmethod(forward)

    def sized_knobs(self, knobs: Any) -> bool:
        return not knobs.TMA and not knobs.TILES


TEMPLATE = AttentionTemplate()
