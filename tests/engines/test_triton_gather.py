"""Embedding lookups in the generated pointwise kernels (templates/_gather.py) against the reference
engine, under Triton's interpreter: out-of-range indices (negative, past the table, past int32) read
zeros, every index type, odd sizes, fused with the pointwise ops after the lookup."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og

from ..helpers import assert_engine_matches, requires_cuda

pytestmark = pytest.mark.interpreter
DT = og.DataType
V, D = 7, 5


def _indices(idx, dt, rng):
    """Indices of every kind: in range, negative, at and past V, and (INT64) past int32: V + 2**32
    would wrap to a row in range if narrowed before its range is checked."""

    def prepare(pack):
        values = rng.integers(0, V, size=idx.dim)
        flat = values.reshape(-1)
        flat[:4] = [-1, V, V + 3, 0][: flat.size]
        if dt is DT.INT64 and flat.size > 4:
            flat[4] = V + 2**32 - 1
        if dt is DT.UINT8 and flat.size > 4:
            flat[4] = 255
        pack[idx.uid][...] = values.astype(pack[idx.uid].dtype) if dt is not DT.UINT8 else np.abs(values)

    return prepare


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("index_type", [DT.INT64, DT.INT32, DT.INT8, DT.UINT8], ids=lambda d: d.name)
def test_token_and_position_embeddings_are_one_kernel(index_type, dt, rng):
    """GPT-2's input: wte[idx] + wpe[pos], with out-of-range indices reading zeros."""
    g = og.Graph("emb", io_data_type=dt)
    wte = g.tensor(dim=[V, D], name="wte")
    wpe = g.tensor(dim=[3, D], name="wpe")
    idx = g.tensor(dim=[2, 3], name="idx", data_type=index_type)
    pos = g.tensor(dim=[1, 3], name="pos", data_type=DT.INT32)
    g.add(g.embedding(wte, idx), g.embedding(wpe, pos)).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=_indices(idx, index_type, rng))
    assert plan.steps[0].piece.kinds == ("embedding", "embedding", "pointwise")


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_a_lookup_alone_of_a_transposed_table(dt, rng):
    """The table a transpose of a [D, V] tensor (read in place); the output in another type."""
    g = og.Graph("emb_t", io_data_type=dt)
    table = g.tensor(dim=[D, V], name="table")
    idx = g.tensor(dim=[3, 1, 5], name="idx", data_type=DT.INT64)
    g.embedding(g.transpose(table, [1, 0]), idx).set_output(True).set_data_type(DT.FLOAT)
    assert_engine_matches(g, rng, expect_steps=1, prepare=_indices(idx, DT.INT64, rng))


def test_a_lookup_inside_a_concatenation(rng):
    g = og.Graph("emb_cat", io_data_type=DT.FLOAT)
    w = g.tensor(dim=[V, 2], name="w")
    idx = g.tensor(dim=[4], name="idx", data_type=DT.INT32)
    x = g.tensor(dim=[4, 3], name="x")
    g.concatenate([x, g.embedding(w, idx)], axis=1).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=_indices(idx, DT.INT32, rng))


def test_computed_indices_are_not_gathered_in_the_kernel(rng):
    """Indices computed in the piece would be computed at the coordinates of the space, not of a row: the
    index arithmetic runs first, then the lookup."""
    g = og.Graph("emb_idx", io_data_type=DT.FLOAT)
    w = g.tensor(dim=[V, D], name="w")
    idx = g.tensor(dim=[2, 3], name="idx", data_type=DT.INT32)
    shifted = g.add(idx, 1).set_data_type(DT.INT32)
    g.embedding(w, shifted).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2, prepare=_indices(idx, DT.INT32, rng))
    assert "computed in the piece" in plan.describe()


@pytest.mark.parametrize("row", [2, -1, V])
def test_one_index_for_the_whole_block(row, rng):
    """A single index (a scalar load): in range, negative, past the table."""
    g = og.Graph("emb_one", io_data_type=DT.FLOAT)
    w = g.tensor(dim=[V, D], name="w")
    idx = g.tensor(dim=[1], name="idx", data_type=DT.INT64)
    g.mul(g.embedding(w, idx), 3.0).set_output(True)

    def prepare(pack):
        pack[idx.uid][...] = row

    assert_engine_matches(g, rng, expect_steps=1, prepare=prepare)


@pytest.mark.gpu
@requires_cuda
def test_gpu_token_and_position_embeddings_at_gpt2_sizes(rng):
    """GPT-2's wte [50304, 768] and wpe [1024, 768] at 8 x 1024 tokens, bf16, some indices out of range."""
    g = og.Graph("emb", io_data_type=DT.BFLOAT16)
    wte = g.tensor(dim=[50304, 768], name="wte")
    wpe = g.tensor(dim=[1024, 768], name="wpe")
    idx = g.tensor(dim=[8, 1024], name="idx", data_type=DT.INT64)
    pos = g.tensor(dim=[1, 1024], name="pos", data_type=DT.INT64)
    g.add(g.embedding(wte, idx), g.embedding(wpe, pos)).set_output(True)

    def prepare(pack):
        values = np.random.default_rng(3).integers(-2, 50310, size=(8, 1024))
        pack[idx.uid][...] = values
        pack[pos.uid][...] = np.arange(1024)[None, :]

    assert_engine_matches(g, rng, device="cuda", expect_steps=1, prepare=prepare)
