"""core/evolve.py: a frozen dataclass copied with some fields changed, as dataclasses.replace makes it."""

from __future__ import annotations

import dataclasses

import pytest

import opgraph as og
from opgraph.core.evolve import evolve
from opgraph.core.tensor import TensorDesc


def test_a_copy_equals_what_replace_makes_and_leaves_the_original():
    t = TensorDesc(7, "x", (2, 3), (3, 1), og.DataType.BFLOAT16, is_virtual=True, is_image=True)
    got = evolve(t, dim=(4, 3), stride=(3, 1))
    assert got == dataclasses.replace(t, dim=(4, 3), stride=(3, 1)) and got is not t
    assert got.is_image and got.is_virtual and t.dim == (2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.dim = (1,)  # type: ignore[misc]


def test_a_name_that_is_no_field_is_refused():
    t = TensorDesc(7, "x", (2,), (1,), og.DataType.FLOAT)
    with pytest.raises(AssertionError, match="not fields of TensorDesc"):
        evolve(t, shape=(3,))
