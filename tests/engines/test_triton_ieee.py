"""fp32 GEMM-class ops have a full-fp32 ("ieee") config in every heuristic mode: a build that filters
out tf32 (deselect_numeric_notes=[DOWN_CONVERT_INPUTS]) finds one in modes A and FALLBACK too."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.engines import get_engine
from opgraph.core.config import NumericalNote
from opgraph.build.filters import ConfigFilter
from opgraph.core.config import HeurMode
from opgraph.core.piece import make_piece

H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)  # configs need no GPU to be listed


def _piece(kind: str):
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    if kind == "matmul":
        y = g.matmul(g.tensor(dim=[1, 64, 32], name="a"), g.tensor(dim=[1, 32, 48], name="b"))
    else:
        y = g.conv_fprop(g.tensor(dim=[2, 16, 8, 8], name="x"), g.tensor(dim=[16, 16, 3, 3], name="w"), padding=1)
    g.relu(y).set_output(True)
    final = g.final
    return make_piece(final, 0, final.nodes)


@pytest.mark.parametrize("kind", ["matmul", "conv_fprop"])
@pytest.mark.parametrize("mode", [HeurMode.INSTANT, HeurMode.A, HeurMode.FALLBACK, HeurMode.B])
def test_ieee_fp32_config_in_every_mode(kind, mode):
    pytest.importorskip("triton")
    engine = get_engine("triton")
    piece = _piece(kind)
    configs = engine.configs(piece, H100, mode)
    assert configs, engine.supports(piece, H100).reason
    assert NumericalNote.DOWN_CONVERT_INPUTS in configs[0].numerical_notes, "tf32 stays the heuristic's pick"
    kept, _ = ConfigFilter.from_options({"deselect_numeric_notes": [NumericalNote.DOWN_CONVERT_INPUTS]}).keep(configs)
    assert kept, [str(c) for c in configs]
    assert all(c.knob("fp32_precision") == "ieee" for c in kept)
