"""The backend enums are written out as classes (opgraph/backend/enums.py); these keep the ones that mirror
opgraph's own vocabularies in step with them and pin the C-name printing."""

from __future__ import annotations

import pytest

import opgraph.backend as be
from opgraph.backend import names
from opgraph.core.config import BehaviorNote, HeurMode, NumericalNote
from opgraph.ops.pointwise import PointwiseMode
from opgraph.ops.reduction import ReductionMode


@pytest.mark.parametrize(
    "backend, ours, prefix",
    [
        (names.cudnnPointwiseMode_t, PointwiseMode, "CUDNN_POINTWISE_"),
        (names.cudnnReduceTensorOp_t, ReductionMode, "CUDNN_REDUCE_TENSOR_"),
    ],
    ids=["pointwise", "reduction"],
)
def test_mirrored_enums_list_opgraphs_members_in_order(backend, ours, prefix):
    got = [(m.name.removeprefix(prefix), m.value) for m in backend]
    want = [(m.name, i) for i, m in enumerate(ours)]
    assert got == want, f"add the new {ours.__name__} members to {backend.__name__} in opgraph/backend/enums.py"


def test_every_opgraph_note_and_heur_mode_has_a_backend_value():
    assert set(names.NUMERICAL_NOTES) == set(NumericalNote)
    assert set(names.BEHAVIOR_NOTES) == set(BehaviorNote)
    assert set(names.HEUR_MODES.values()) == set(HeurMode)


def test_members_print_and_export_under_their_c_names():
    kinds = names.ENUMS
    assert len({k.__name__ for k in kinds}) == len(kinds)
    for kind in kinds:
        values = [m.value for m in kind]
        assert values == list(range(len(values))), kind.__name__
        for m in kind:
            assert repr(m) == str(m) == m.name
            assert getattr(be, m.name) is m
            assert m.name in be.__all__
