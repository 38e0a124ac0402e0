"""The Triton engine's typed knobs (opgraph/engines/triton/knobs.py) and template protocol: a knob set is
stored as its pairs and read back equal, bad values and unknown names are typed errors when a config is
read, and the engine keeps a piece's match from its verdict to its kernels."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.config import EngineConfig, HeurMode
from opgraph.core.device import CPU, Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.engines.triton import TEMPLATE_BY_NAME
from opgraph.engines.triton.knobs import (
    FlatKnobs,
    PointwiseKnobs,
    ReductionKnobs,
    RowStripKnobs,
    StatsKnobs,
    TileKnobs,
)
from opgraph.engines.triton.templates.base import Match

DT = og.DataType
H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)


def _matmul_piece(dt=DT.HALF):
    g = og.Graph("mm", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[64, 32], name="a"), g.tensor(dim=[32, 48], name="b")
    g.matmul(a, b).set_output(True)
    return make_piece(g.final, 0, g.final.nodes)


@pytest.mark.parametrize(
    "knobs",
    [
        TileKnobs(
            BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, SPLIT_K=2, num_warps=8, num_stages=3, fp32_precision="ieee"
        ),
        TileKnobs(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, TMA=1, PERSISTENT=132, FLATTEN=1, EPILOGUE_SUBTILE=2),
        RowStripKnobs(ROWS=7, BLOCK_W=32, BLOCK_N=8, num_warps=4, num_stages=4, MAXNREG=128),
        RowStripKnobs(ROWS=28, BLOCK_W=32, BLOCK_N=16, num_warps=4, num_stages=3, WLOAD=1),
        FlatKnobs(BLOCK=1024, num_warps=4),
        PointwiseKnobs(ROWS=2, COLS=1024, num_warps=4),
        ReductionKnobs(BLOCK_M=4, BLOCK_K=1024, SPLIT=3, num_warps=8, STAGES=3),
        StatsKnobs(BR=64, BC=64, CHUNK=4, W=4, ABR=32, ABC=128, AW=8, BS=8, CW=4, ST=3, PF=0, ORDER=1),
    ],
    ids=lambda k: type(k).__name__,
)
def test_a_knob_set_reads_back_from_its_pairs(knobs):
    pairs = knobs.pairs()
    assert [n for n, _ in pairs] == sorted(n for n, _ in pairs)
    assert all(v is not None for _, v in pairs)  # (knobs a config leaves out are not stored)
    assert type(knobs).parse(dict(pairs)) == knobs


def test_stored_values_become_the_knobs_types():
    assert TileKnobs.parse({"BLOCK_M": "64", "BLOCK_N": 32.0, "fp32_precision": "tf32"}) == TileKnobs(
        BLOCK_M=64, BLOCK_N=32, fp32_precision="tf32"
    )


@pytest.mark.parametrize(
    "stored, match",
    [
        ({"BLOCK_M": 64, "BLOCK_N": 64, "ROWS": 2}, "ROWS: not a knob of"),
        ({"BLOCK_N": 64}, "needs the knob\\(s\\) BLOCK_M"),
        ({"BLOCK_M": 48, "BLOCK_N": 64}, "BLOCK_M=48 must be a power of two >= 16"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 4}, "BLOCK_K=4 must be a power of two >= 8"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 0}, "SPLIT_K=0 must be >= 1"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "FLATTEN": 1}, "FLATTEN=1 must be 0, or 1 with PERSISTENT"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "PERSISTENT": 8, "SPLIT_K": 2, "FLATTEN": 1}, "FLATTEN=1 must be 0"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "EPILOGUE_SUBTILE": 4}, "EPILOGUE_SUBTILE=4 must be 1 or 2"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "fp32_precision": "tf64"}, "is not 'tf32' or 'ieee'"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 3}, "num_warps=3 must be a power of two"),
        ({"BLOCK_M": 64, "BLOCK_N": "many"}, "is not a number"),
        ({"BLOCK_M": 64, "BLOCK_N": 64, "MERGE_TAPS": 2}, "MERGE_TAPS=2 must be one of 0, 1"),
    ],
)
def test_bad_knobs_are_typed_errors(stored, match):
    with pytest.raises(AttributeValueError, match=match):
        TileKnobs.parse(stored, "matmul")


def test_wload_is_a_flag_and_unmeasured():
    with pytest.raises(AttributeValueError, match="WLOAD=2 must be one of 0, 1"):
        RowStripKnobs(ROWS=4, BLOCK_W=8, BLOCK_N=8, WLOAD=2)
    assert RowStripKnobs(ROWS=4, BLOCK_W=8, BLOCK_N=8, WLOAD=1).unmeasured()
    assert not RowStripKnobs(ROWS=4, BLOCK_W=8, BLOCK_N=8).unmeasured()


def test_a_pointwise_config_walks_one_way():
    with pytest.raises(AttributeValueError, match="walks one way"):
        PointwiseKnobs(BLOCK=1024, ROWS=2, COLS=256)
    with pytest.raises(AttributeValueError, match="walks one way"):
        PointwiseKnobs(TILE_I=64)


def test_a_tensor_core_loop_needs_sixteen_lanes_of_k():
    """BLOCK_K=8 is a knob value (the depthwise wgrad stencil steps 8 pixels), not one tl.dot takes."""
    piece = _matmul_piece()
    matmul = TEMPLATE_BY_NAME["matmul"]
    with pytest.raises(AttributeValueError, match="BLOCK_K=8 must be a power of two >= 16 \\(tl.dot"):
        matmul.generate(piece, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 8}, CPU)


def test_match_is_the_analysis_its_methods_answer_from():
    piece = _matmul_piece()
    m = TEMPLATE_BY_NAME["matmul"].match(piece, CPU)
    assert isinstance(m, Match) and m.ok and m.piece is piece and m.template.name == "matmul"
    knobs = m.candidates()
    assert all(isinstance(k, TileKnobs) for k in knobs)
    assert m.knobs(dict(knobs[0].pairs())) == knobs[0]
    assert "def kernel(" in m.generate(knobs[0]).source
    refused = TEMPLATE_BY_NAME["conv_fprop"].match(piece, CPU)
    assert not refused.ok and "no conv_fprop" in refused.reason


def test_the_engine_keeps_a_pieces_match_and_matches_a_stored_config_again(monkeypatch):
    """Within one build (Engine.session) supports' match serves configs and compile; after it nothing
    is kept (a kept piece held its graph, and the user's plans through it)."""
    engine = get_engine("triton")
    piece = _matmul_piece()
    calls = []
    matmul = TEMPLATE_BY_NAME["matmul"]
    original = type(matmul).match
    monkeypatch.setattr(type(matmul), "match", lambda self, p, d: calls.append(p) or original(self, p, d))
    with engine.session():
        assert engine.supports(piece, CPU).ok
        configs = engine.configs(piece, CPU, HeurMode.B)
        engine.generated(piece, configs[0], CPU)
        assert calls == [piece]  # supports' match served configs and the kernels
        stored = EngineConfig("triton", configs[0].knobs)  # as a plan file gives it back, for a piece built anew
        again = make_piece(piece.graph, piece.index, list(piece.nodes))
        assert engine.generated(again, stored, CPU).source == engine.generated(piece, configs[0], CPU).source
        assert calls == [piece]  # (an identical piece of the graph: the kernels generated for the first)
    engine.supports(again, CPU)
    engine.generated(again, stored, CPU)
    assert calls == [piece, again, again]  # the session's matches and kernels went with it


def test_a_config_of_a_template_that_declines_the_piece_is_a_typed_error():
    piece = _matmul_piece()
    config = EngineConfig("triton", (("template", "pooling"), ("BLOCK", 256)))
    with pytest.raises(AttributeValueError, match="the pooling template cannot run this piece"):
        get_engine("triton").generated(piece, config, CPU)


def test_configs_store_the_knobs_of_their_family():
    piece = _matmul_piece()
    for config in get_engine("triton").configs(piece, H100, HeurMode.B):
        knobs = dict(config.knobs)
        assert knobs.pop("template") == "matmul"
        assert TileKnobs.parse(knobs).pairs() == config.knobs[1:]
