"""Stand-in engines for the build tests: each says which pieces it runs through a rule given to it, and
offers one config per heuristic mode. They are passed to partition/rank_configs directly, never
registered, so no other test sees them."""

from __future__ import annotations

from collections.abc import Callable

import opgraph as og
from opgraph.core.config import EngineConfig, HeurMode, Support
from opgraph.core.device import CPU, Device
from opgraph.core.piece import Piece
from opgraph.engines.base import Engine

Rule = Callable[[Piece], "str | None"]  # None: runs the piece; else the reason it does not


class FakeEngine(Engine):
    def __init__(
        self,
        name: str,
        rule: Rule = lambda piece: None,
        *,
        fuses: bool = False,
        configs: Callable[[Piece, HeurMode], list[EngineConfig]] | None = None,
    ) -> None:
        self.name = name  # type: ignore[misc]  (a ClassVar on real engines)
        self.fuses_neighbours = fuses  # type: ignore[misc]
        self._rule = rule
        self._configs = configs
        self.asked: list[HeurMode] = []  # the modes configs() was called with

    def available(self, device: Device) -> Support:
        return Support.yes()

    def supports(self, piece: Piece, device: Device) -> Support:
        why = self._rule(piece)
        return Support.yes() if why is None else Support.no(why, piece.nodes[0])

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        assert self.supports(piece, device).ok, f"{self.name} asked for configs of a piece it declined"
        self.asked.append(mode)
        if self._configs is not None:
            return self._configs(piece, mode)
        return [EngineConfig(self.name, (("mode", mode.value),), why=f"{self.name} {mode.name}")]

    def compile(self, piece, config, device):  # pragma: no cover  (the build tests compile nothing)
        raise AssertionError("fake engines compile nothing")


def at_most(n: int) -> Rule:
    return lambda piece: None if len(piece.nodes) <= n else f"at most {n} ops"


def only_kinds(*names: str) -> Rule:
    """Runs a piece of one op whose name is in `names`."""

    def rule(piece: Piece) -> str | None:
        if len(piece.nodes) == 1 and piece.nodes[0].name in names:
            return None
        return f"runs only {'/'.join(names)} alone"

    return rule


def chain(names=("e", "m", "r", "a")) -> og.FinalGraph:
    """x -> exp 'e' -> mul 'm' (by b) -> relu 'r' -> add 'a' (+1) = y: four pointwise ops in a row."""
    g = og.Graph("chain", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 3], name="x")
    b = g.tensor(dim=[1, 3], name="b")
    e, m, r, a = names
    y = g.add(g.relu(g.mul(g.exp(x, name=e), b, name=m), name=r), 1.0, name=a)
    y.set_output(True).set_name("y")
    g.validate()
    return g.final


# simulated GPUs, as `resolve_device` would describe them (no GPU needed to rank for them)
H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)


__all__ = ["CPU", "H100", "H200", "FakeEngine", "at_most", "chain", "only_kinds"]
