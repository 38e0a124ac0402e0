"""The warp-specialised forward (knob WS=1): the key loop as Triton's `tl.range(..., warp_specialize=True)`.
On Hopper, Triton 3.6 then splits the program into a producer warp group that issues the loop's TMA
loads and consumer groups that run the products and the softmax (registers moved between them with
setmaxnreg), FlashAttention-3's structure, from the same source. Triton partitions such a loop only
when its loads are tensor-descriptor loads (a pointer load in it failed the partitioning pass) and it
holds no branch (a run-time `if` left it unpartitioned): so the loop is the ONELOOP form with its masks
applied at every step, over TMA=1's descriptors, and loads nothing else (no bias tile, dropout mask,
block-mask word or page table). Under the interpreter, and where Triton does not partition, it is an
ordinary loop."""

from __future__ import annotations

from .common import descriptors_ok
from .spec import AttnSpec

__all__ = ["ws_refusal"]


def ws_refusal(spec: AttnSpec) -> str | None:
    """Why the forward's key loop cannot be warp-specialised (None: it can)."""
    reasons = (
        (spec.bias is not None, "a bias tile is loaded in the loop"),
        (spec.dropout is not None, "dropout draws or loads its mask in the loop"),
        (spec.block_mask is not None, "the block mask is read in the loop"),
        (spec.score_mod is not None, "a score modifier may read tensors in the loop"),
        (
            not descriptors_ok(spec),
            "q, k or v cannot be read through tensor descriptors (packed or paged, a prologue, a bucket "
            "kernel's run-time shapes, or their alignment)",
        ),
    )
    return next((why for bad, why in reasons if bad), None)
