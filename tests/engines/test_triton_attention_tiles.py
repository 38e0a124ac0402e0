"""The tile list (opgraph/engines/triton/attention/tiles.py, knob TILES=1) on packed layouts where each
role has its own offsets and row count: outputs of different sizes (O smaller than Stats, dK smaller
than dV), a sequence starting before its output's first row, offsets counted in elements, the bottom-
right causal band's ascending key levels. Forward and backward launched directly under Triton's
interpreter, every output compared with the reference engine on random inputs with poisoned outputs
(the forward and the backward's gradients; the backward reads given O and Stats)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.testing import compare, random_pack, reference_outputs

DT = og.DataType
BSHD = (0, 2, 1, 3)
HQ, HK, D = 4, 2, 16
FWD_ROLES = ("q", "k", "v", "o", "stats")
BWD_ROLES = ("q", "k", "v", "o", "stats", "dO", "dQ", "dK", "dV")

pytestmark = pytest.mark.interpreter


def _tensor(g, name, heads, rows, width, dtype=None):
    dims = (1, heads, rows, width)
    return g.tensor(dim=dims, stride=packed_strides(dims, BSHD), name=name, **({"data_type": dtype} if dtype else {}))


def _lengths_and_offsets(g, b, roles, sq, skv, shared=None, **opts):
    """Lengths and an offsets tensor per role (`shared`: role -> the role whose tensor it reads)."""
    kw = dict(opts, use_padding_mask=True, attn_scale=0.3, max_seq_len_q=sq, max_seq_len_kv=skv)
    kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
    kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    shared = shared or {}
    for r in roles:
        if r not in shared:
            kw[f"{r}_ragged_offset"] = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name=f"off_{r}")
    for r, other in shared.items():
        kw[f"{r}_ragged_offset"] = kw[f"{other}_ragged_offset"]
    return kw


def forward_graph(b, sq, skv, rows, per_row=None, shared=None, **opts):
    """sdpa over packed q, k, v, O, Stats, each with its own offsets (or `shared`'s) and `rows[role]` rows."""
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q, k, v = (_tensor(g, r, HQ if r == "q" else HK, rows[r], D) for r in "qkv")
    kw = _lengths_and_offsets(g, b, FWD_ROLES, sq, skv, shared, **opts)
    o, st = g.sdpa(q, k, v, generate_stats=True, name="fwd", **kw)
    o.set_output(True).set_dim([1, HQ, rows["o"], D]).set_stride(packed_strides((1, HQ, rows["o"], D), BSHD))
    st.set_output(True).set_dim([1, HQ, rows["stats"], 1]).set_stride(packed_strides((1, HQ, rows["stats"], 1), BSHD))
    if per_row:  # offsets counted in elements (cuDNN's): a row of each role is per_row[role] elements
        rec = next(r for r in g._records if r.op.kind == "sdpa")
        rec.op = dataclasses.replace(rec.op, ragged_offset_strides=tuple(sorted(per_row.items())))
        g._invalidate()
    return g


def backward_graph(b, sq, skv, rows, shared=None, **opts):
    """sdpa_backward alone over packed tensors, each role with its own offsets (or `shared`'s) and
    `rows[role]` rows (dQ, dK, dV as q, k, v)."""
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    heads = {"q": HQ, "k": HK, "v": HK, "o": HQ, "dO": HQ}
    x = {r: _tensor(g, r, heads[r], rows[r], D) for r in heads}
    st = _tensor(g, "stats", HQ, rows["stats"], 1, DT.FLOAT)
    kw = _lengths_and_offsets(g, b, BWD_ROLES, sq, skv, shared, **opts)
    for y in g.sdpa_backward(x["q"], x["k"], x["v"], x["o"], x["dO"], st, name="bwd", **kw)[:3]:
        y.set_output(True)
    return g


def run(g, kind, lq, lkv, offsets, knobs, rng):
    """Launch the kernels of `g`'s one attention node with `knobs` under the interpreter; the outputs
    compared with the reference engine's (None: all equal, else the first mismatch)."""
    import torch

    from opgraph.engines.triton.attention import BwdKnobs, FwdKnobs, backward, forward
    from opgraph.engines.triton.attention.run import launch
    from opgraph.engines.triton.templates import attention as fwd_template
    from opgraph.engines.triton.templates import attention_bwd as bwd_template

    final = g.final
    node = next(n for n in final.nodes if n.kind == kind)
    template = fwd_template if kind == "sdpa" else bwd_template
    spec = template.TEMPLATE.matched(make_piece(final, 0, [node]), Device("cpu")).spec()
    pack = random_pack(final, rng)
    by = {final.tensors[u].name: u for u in final.inputs}
    pack[by["seq_len_q"]][...] = np.array(lq).reshape(-1, 1, 1, 1)
    pack[by["seq_len_kv"]][...] = np.array(lkv).reshape(-1, 1, 1, 1)
    if "stats" in by:  # (a given Stats: log-sum-exps the scores do not exceed)
        pack[by["stats"]][...] = np.abs(pack[by["stats"]]) + 3.0
    for r, v in offsets.items():
        pack[by[f"off_{r}"]][...] = np.array(v).reshape(-1, 1, 1, 1)
    want = reference_outputs(final, pack)
    buffers = {u: torch.from_numpy(x) for u, x in pack.items()}
    if kind == "sdpa":
        gen = forward(spec, FwdKnobs(num_warps=4, num_stages=1, **knobs))
    else:
        gen = backward(spec, BwdKnobs(W1=4, S1=1, W2=4, S2=1, **knobs))
    launch(gen, buffers, interpret=True)
    for u in final.outputs:
        bad = compare(final.tensors[u], buffers[u].numpy(), want[u], rtol=2e-3, atol=2e-4)
        if bad is not None:
            return bad
    return None


FWD = {"BLOCK_M": 16, "BLOCK_N": 16, "ONELOOP": 1}
BWD = {"BLOCK_M1": 16, "BLOCK_N1": 16, "BLOCK_M2": 16, "BLOCK_N2": 16, "ONELOOP": 1}
CUM = np.array([0, 20, 60])


@pytest.mark.parametrize("opts", [{}, {"use_causal_mask": True}], ids=["none", "causal"])
def test_forward_outputs_of_different_sizes(opts, rng):
    """O of 30 rows, Stats of 60, the same offsets: sequence 1's rows 20..29 in both, 30..59 in Stats
    only; the tiles of both outputs run."""
    rows = {"q": 60, "k": 60, "v": 60, "o": 30, "stats": 60}
    offs = dict.fromkeys(FWD_ROLES, CUM)
    for tiles in (0, 1):
        assert (
            run(forward_graph(2, 40, 40, rows, **opts), "sdpa", (20, 40), (20, 40), offs, {**FWD, "TILES": tiles}, rng)
            is None
        )


def test_forward_sequence_before_its_outputs_first_row(rng):
    """Sequence 0 of O and Stats (one offsets tensor) starts 112 rows before their first: only its last
    16 rows are written; its blocks wholly before row 0 take no program from sequence 1 (5 programs a
    head for 2 tiles; counting those blocks, 9)."""
    rows = {"q": 200, "k": 40, "v": 40, "o": 32, "stats": 32}
    offs = {"q": [0, 128, 144], "k": [0, 16, 32], "v": [0, 16, 32], "o": [-112, 16, 32]}
    g = forward_graph(2, 128, 16, rows, shared={"stats": "o"})
    assert run(g, "sdpa", (128, 16), (16, 16), offs, {**FWD, "TILES": 1}, rng) is None


def test_forward_offsets_in_elements(rng):
    rows = {"q": 60, "k": 60, "v": 60, "o": 60, "stats": 60}
    per_row = {"q": HQ * D, "k": HK * D, "v": HK * D, "o": HQ * D, "stats": HQ}
    offs = {r: CUM * per_row[r] for r in FWD_ROLES}
    g = forward_graph(2, 40, 40, rows, per_row=per_row, use_causal_mask=True)
    assert run(g, "sdpa", (20, 40), (20, 40), offs, {**FWD, "TILES": 1}, rng) is None


@pytest.mark.parametrize("opts", [{}, {"use_causal_mask_bottom_right": True}], ids=["none", "causal_br"])
def test_backward_gradients_of_different_sizes(opts, rng):
    """dK of 30 rows, dV of 60: the key tiles of both gradients run (lowest first under the band)."""
    cq = np.array([0, 20, 38])
    rows = {"q": 38, "o": 38, "stats": 38, "dO": 38, "dQ": 38, "k": 30, "v": 60}  # (dK, dV: as k, v)
    offs = {r: (cq if r in ("q", "o", "stats", "dO", "dQ") else CUM) for r in BWD_ROLES}
    g = backward_graph(2, 20, 40, rows, **opts)
    assert run(g, "sdpa_backward", (20, 18), (20, 40), offs, {**BWD, "TILES": 1}, rng) is None


@pytest.mark.parametrize("opts", [{}, {"use_causal_mask_bottom_right": True}], ids=["none", "causal_br"])
def test_backward_keys_before_their_gradients_first_row(opts, rng):
    cq = np.array([0, 20, 36])
    rows = {"q": 36, "o": 36, "stats": 36, "dO": 36, "dQ": 36, "k": 32, "v": 32}
    offs = {r: (cq if r in ("q", "o", "stats", "dO", "dQ") else np.array([-112, 16, 32])) for r in BWD_ROLES}
    offs = {r: v for r, v in offs.items() if r not in ("dV", "dK", "v")}
    g = backward_graph(2, 20, 128, rows, shared={"v": "k", "dK": "k", "dV": "k"}, **opts)
    assert run(g, "sdpa_backward", (20, 16), (128, 16), offs, {**BWD, "TILES": 1}, rng) is None


def test_no_tile_list_in_a_dynamic_buckets_kernels():
    """A bucket's kernels take their batch and lengths at run time: the tile list is not offered there."""
    from opgraph.engines.triton.templates import attention as fwd_template
    from opgraph.engines.triton.templates import attention_bwd as bwd_template

    from .test_triton_attention_dynamic import _packed_piece

    for backward, template in ((False, fwd_template), (True, bwd_template)):
        match = template.TEMPLATE.matched(_packed_piece(backward, True), Device("cpu"))
        assert match.symbolic is not None
        assert not any(k.TILES for k in match.candidates())
        assert not template.TEMPLATE.sized_knobs(match.candidates()[0].replace(TILES=1))
        static = template.TEMPLATE.matched(_packed_piece(backward, False), Device("cpu"))
        assert any(k.TILES for k in static.candidates())  # (the same piece at one shape: offered)
