"""Answers shared within one planning by identical pieces (opgraph/build/shared.py): a model's repeated
layers are ranked once per structure, and the Triton engine generates their kernels once (the other
layers' launches moved to their own tensors), where by-reference flags or shapes differ they are not."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build import heuristics
from opgraph.build.planner import plan_steps
from opgraph.build.shared import shared, shared_answers
from opgraph.core.piece import make_piece

from ..helpers import assert_engine_matches


def layers(count: int, *, by_reference: int | None = None, wide: int | None = None) -> og.Graph:
    """`count` residual layers x + relu(x @ W_i) over x [6, 16] (fp32); layer `by_reference` reads its
    weight by reference, layer `wide` has a 16 x 24 weight and a 24 x 16 one after it."""
    g = og.Graph("layers", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 6, 16], name="x")
    for i in range(count):
        if i == wide:
            w1 = g.tensor(dim=[1, 16, 24], name=f"w{i}a")
            w2 = g.tensor(dim=[1, 24, 16], name=f"w{i}b")
            x = g.add(x, g.matmul(g.relu(g.matmul(x, w1, name=f"mm{i}a")), w2, name=f"mm{i}b"), name=f"res{i}")
            continue
        w = g.tensor(dim=[1, 16, 16], name=f"w{i}", is_by_reference=i == by_reference)
        x = g.add(x, g.relu(g.matmul(x, w, name=f"mm{i}"), name=f"relu{i}"), name=f"res{i}")
    x.set_output(True)
    return g


def test_identical_layers_run_one_generated_source_each_on_its_own_tensors(rng):
    plan = assert_engine_matches(layers(5), rng)
    sources = [plan.source(i) for i in range(len(plan.steps))]
    # (the first layer reads the graph's input, the last writes its output: virtual tensors in the others)
    assert len(sources) == 5 and len(set(sources[1:4])) == 1 and sources[0] != sources[1], plan.describe()
    # the launches read each layer's own tensors (a shared launch would read layer 1's: outputs differ)
    read = [frozenset(a.uid for l in s.kernel.generated.launches for a in l.args) for s in plan.steps]
    assert all(len(r) > 1 for r in read) and len(set(read)) == 5


def test_a_by_reference_weight_or_another_shape_is_generated_for_itself(rng):
    plan = assert_engine_matches(layers(6, by_reference=2, wide=4), rng)
    sources = [plan.source(i) for i in range(len(plan.steps))]
    assert sources[1] == sources[3], plan.describe()
    assert sources[2] != sources[1]  # (its weight's address read from the address table)
    assert all(s != sources[1] for s in sources[4:])


def test_identical_layers_are_ranked_once(monkeypatch):
    made = []
    rank = heuristics._rank
    monkeypatch.setattr(heuristics, "_rank", lambda piece, *a: made.append(piece) or rank(piece, *a))
    three = plan_steps(layers(3).final, device="cpu", engines=["triton"], compile="lazy")
    first = len(made)
    six = plan_steps(layers(6).final, device="cpu", engines=["triton"], compile="lazy")
    assert len(six.steps) == 6 and len(three.steps) == 3
    assert len(made) - first == first  # (layers 1-4 ask what layer 1 of three asked)
    assert [s.config for s in six.steps] == [three.steps[0].config] + [three.steps[1].config] * 4 + [
        three.steps[2].config
    ]


def test_shared_answers_are_kept_by_structure_and_graph_within_a_planning():
    g, other = layers(4).final, layers(4).final
    a, b = [make_piece(g, 0, [n]) for n in g.nodes if n.kind == "matmul"][1:3]
    c = [make_piece(other, 0, [n]) for n in other.nodes if n.kind == "matmul"][1]
    asked = []

    def answer(piece):
        return shared("q", piece, (), lambda: asked.append(piece) or len(asked))

    assert answer(a) == (1, a) and answer(b) == (2, b)  # (outside a planning: asked each time)
    with shared_answers():
        assert answer(a) == (3, a)
        assert answer(b) == (3, a)  # identical: the first one's answer, and that piece
        assert answer(c) == (4, c)  # another graph asks again
    assert answer(b) == (5, b)


@pytest.mark.parametrize("flag", ["by_reference", "shape"])
def test_structure_key_tells_apart_what_the_signature_does_or_does_not(flag):
    g = layers(4, by_reference=2 if flag == "by_reference" else None, wide=2 if flag == "shape" else None).final
    a, b = [make_piece(g, 0, [n]) for n in g.nodes if n.kind == "matmul"][1:3]
    assert a.structure_key() != b.structure_key()
    assert (a.signature() == b.signature()) is (flag == "by_reference")
    assert len(a.uid_order()) == len(set(a.uid_order())) == 3
