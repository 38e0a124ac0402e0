"""Answers shared, within one planning, by the pieces that compute the same thing.

A model's identical layers are cut into pieces that differ only in their tensors' UIDs; ranking their
configs (every engine's support check and cost model, the policy's order), weighing a prologue apart
and offering a bucket step's tile variants ask each of them the same questions. Within one planning
(`shared_answers`, entered by the planner's `sessions`), such an answer is kept by what the piece
computes (`Piece.structure_key`: its signature and its tensors' by-reference and virtual flags) and by
its graph: another graph (a bucket's other shapes, a nested build of another shape) asks again.
Nothing outlives the planning. (The Triton engine shares its generated kernels the same way, in its
own session: engines/triton.)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..core.piece import Piece

T = TypeVar("T")

# kind, piece key, the question's other terms -> (the graph, the piece asked first, its answer)
_ANSWERS: ContextVar[dict[Hashable, tuple[Any, Any, Any]] | None] = ContextVar("opgraph_shared_answers", default=None)


@contextmanager
def shared_answers() -> Iterator[None]:
    """One planning's span: answers kept here are dropped when it ends (a planning within a planning
    shares the outer one's)."""
    if _ANSWERS.get() is not None:
        yield
        return
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def shared(kind: str, piece: Piece, terms: Hashable, make: Callable[[], T]) -> tuple[T, Piece]:
    """The answer to question `kind` (with `terms`) about `piece`: made now, or the one made for an
    identical piece of the same graph earlier in this planning; with the piece it was made for (the
    caller re-labels what names that piece). Outside a planning, always made now."""
    answers = _ANSWERS.get()
    if answers is None:
        return make(), piece
    key = (kind, id(piece.graph), piece.structure_key(), terms)
    hit = answers.get(key)
    if hit is not None and hit[0] is piece.graph:
        return hit[2], hit[1]
    answer = make()
    answers[key] = (piece.graph, piece, answer)
    return answer, piece
