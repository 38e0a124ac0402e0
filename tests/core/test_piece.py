"""core.piece: a piece's boundary (inputs read from outside, outputs needed outside) and its signature,
the tuning caches' key: the same for the same computation whatever the names and UIDs, different
when anything that changes the kernel changes."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.piece import make_piece

DT = og.DataType


def graph(
    *,
    dims=(2, 3, 4),
    layout="packed",
    io=DT.FLOAT,
    mid=DT.FLOAT,
    compute=None,
    mode="exp",
    const=1.0,
    names=("x", "b", "e", "m", "r", "y"),
    uids=None,
    swap=False,
    keep_mid=False,
    same_input=False,
) -> og.FinalGraph:
    """y = (mode(x) * b) + const: three pointwise ops; `uids` for x, b and y."""
    nx, nb, ne, nm, nr, ny = names
    ux, ub, uy = uids or (None, None, None)
    g = og.Graph("sig", io_data_type=io, intermediate_data_type=mid)
    stride = None if layout == "packed" else [1, dims[0], dims[0] * dims[1]]
    x = g.tensor(dim=list(dims), stride=stride, name=nx, uid=ux)
    b = x if same_input else g.tensor(dim=list(dims), stride=stride, name=nb, uid=ub)
    e = getattr(g, mode)(x, name=ne, compute_data_type=compute)
    m = g.mul(b, e, name=nm) if swap else g.mul(e, b, name=nm)
    if keep_mid:
        e.set_output(True)
    y = g.add(m, const, name=nr).set_output(True).set_name(ny)
    if uy is not None:
        y.set_uid(uy)
    g.validate()
    return g.final


def signature(f: og.FinalGraph) -> str:
    return make_piece(f, 0, f.nodes).signature()


BASE = signature(graph())


def test_the_signature_is_a_short_stable_hex_key():
    assert len(BASE) == 16 and int(BASE, 16) >= 0
    assert signature(graph()) == BASE  # a fresh graph of the same computation


def test_names_uids_and_the_piece_index_do_not_change_it():
    renamed = graph(names=("in", "bias", "exp1", "scale", "shift", "out"), uids=(40, 7, 3))
    plain = graph()
    assert [renamed.tensor(n).uid for n in ("in", "bias", "out")] == [40, 7, 3]
    assert [plain.tensor(n).uid for n in ("x", "b", "y")] != [40, 7, 3]
    assert signature(renamed) == BASE
    assert make_piece(renamed, 5, renamed.nodes).signature() == BASE


@pytest.mark.parametrize(
    "change",
    [
        dict(dims=(2, 3, 5)),
        dict(layout="column-major"),
        dict(io=DT.HALF),
        dict(mid=DT.HALF),
        dict(compute=DT.HALF),
        dict(mode="log"),
        dict(const=2.0),
        dict(swap=True),
        dict(keep_mid=True),
        dict(same_input=True),
    ],
    ids=lambda c: next(iter(c)),
)
def test_anything_that_changes_the_kernel_changes_it(change):
    assert signature(graph(**change)) != BASE


def test_a_sub_piece_is_another_computation():
    f = graph()
    assert make_piece(f, 0, f.nodes[:2]).signature() != BASE


def test_boundary_of_a_piece():
    f = graph(keep_mid=True)
    e, m, r = f.nodes
    x, b, y = f.tensor("x").uid, f.tensor("b").uid, f.tensor("y").uid
    t_e, t_m = e.outputs[0], m.outputs[0]
    first = make_piece(f, 0, [e, m])
    assert first.inputs == (x, b)  # in order of first read
    assert first.outputs == (t_e, t_m)  # e's: a graph output; m's: read by r, outside the piece
    assert f.tensors[t_m].is_virtual
    last = make_piece(f, 1, [r])
    assert last.inputs == (t_m,) and last.outputs == (y,)
    whole = make_piece(f, 0, f.nodes)
    assert whole.inputs == (x, b) and whole.outputs == (t_e, y)  # m's output stays inside
    assert whole.kinds == ("pointwise",) * 3 and whole.tensor(y) is f.tensors[y]
    assert whole.label() == "piece 0 [" + ", ".join(n.name for n in f.nodes) + "]"


def test_pieces_compare_by_content_not_by_graph_object():
    f, h = graph(), graph()
    assert make_piece(f, 0, f.nodes) == make_piece(h, 0, h.nodes)
    assert make_piece(f, 0, f.nodes) != make_piece(f, 1, f.nodes)
