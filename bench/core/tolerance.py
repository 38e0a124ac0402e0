"""The one tolerance rule, for every output of every implementation, ours and the peers' alike.

Each output of each implementation is compared with a float64 reference (relative L2 error,
||got - want|| / ||want||). For each output:

    tolerance = FACTOR x max(the smallest error any peer makes on it, the output type's unit roundoff)

A correctly rounded result is off by up to one unit roundoff, so no peer's error counts as less: a
peer that computes an output exactly (a relu of representable values), or whose scalar happens to
round the right way, does not make the tolerance tighter than FACTOR x what correct rounding
guarantees (before 2026-11-26 the floor was one unit roundoff, and a scalar loss one float32 ulp away
from a correctly rounded peer's failed at 1.07x). When no peer computes an output, the type's FALLBACK tolerance applies and
the verdict says so. An implementation passes when every output's error is finite and within its
tolerance; its worst output (largest error / tolerance) is reported.

An output that is zero in exact arithmetic (its float64 reference is rounding noise: bench.check's
zero_reference) has no relative error; its error is the root-mean-square of got - want, and its
tolerance FACTOR x the smallest such error of a peer, floored at ABSOLUTE_FLOOR itself (not FACTOR x
it: the floor is float64 noise, not a rounding bound of the output's type).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

FACTOR = 3.0
UNIT_ROUNDOFF = {
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}
# used only when no peer computes the output: a few units of the type's rounding at these sizes
FALLBACK = {
    "float8_e4m3fn": 0.12,
    "float8_e5m2": 0.25,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 1e-5,
    "float64": 1e-12,
}
ABSOLUTE_FLOOR = 1e-12  # an absolute error this small is the float64 reference's own rounding
SANE = 0.5  # above this relative error (or non-finite) an output is garbage: its implementation is not timed


@dataclass(frozen=True)
class Tolerance:
    """The tolerance of one output, and what it rests on."""

    value: float
    basis: str  # "3 x <peer>", "3 x unit roundoff (float16)", "float64 rounding (absolute: ...)" or "fallback ..."


@dataclass(frozen=True)
class Verdict:
    """One implementation's standing against the tolerances of a workload's outputs."""

    passed: bool
    worst_output: str | None
    worst_ratio: float | None  # error / tolerance of the worst output (inf when non-finite or missing)
    reason: str = ""


def finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and not math.isinf(x)


def sane(errors: Mapping[str, float | None], limit: float = SANE) -> bool:
    """Worth timing: every output was produced, finite and within `limit` (a failing but close result
    is still timed, and flagged by its verdict)."""
    return bool(errors) and all(finite(e) and e <= limit for e in errors.values())


def output_tolerance(peer_errors: Mapping[str, float | None], dtype: str, absolute: bool = False) -> Tolerance:
    """Tolerance of one output from the errors the peers made on it ({peer: error}); `absolute`: the
    errors are absolute (the output is zero in exact arithmetic)."""
    floor = ABSOLUTE_FLOOR if absolute else FACTOR * UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"])
    kind = ", absolute: exactly zero" if absolute else ""
    good = {p: e for p, e in peer_errors.items() if finite(e)}
    if not good:
        return Tolerance(FALLBACK.get(dtype, FALLBACK["float32"]), f"fallback (no peer computes it{kind})")
    best_peer = min(good, key=lambda p: (good[p], p))
    scaled = FACTOR * good[best_peer]
    if scaled >= floor:
        return Tolerance(scaled, f"{FACTOR:g} x {best_peer}{kind}")
    return Tolerance(
        floor, "float64 rounding (absolute: exactly zero)" if absolute else f"{FACTOR:g} x unit roundoff ({dtype})"
    )


def tolerances(
    errors: Mapping[str, Mapping[str, float | None]],
    peers: set[str] | frozenset[str],
    dtypes: Mapping[str, str],
    absolute: frozenset[str] = frozenset(),
) -> dict[str, Tolerance]:
    """{output: Tolerance} from {impl: {output: error}}; only the implementations in `peers` set it;
    the outputs in `absolute` have absolute errors (zero in exact arithmetic)."""
    out = {}
    for name, dtype in dtypes.items():
        peer_errors = {impl: errs.get(name) for impl, errs in errors.items() if impl in peers}
        out[name] = output_tolerance(peer_errors, dtype, name in absolute)
    return out


def judge(errors: Mapping[str, float | None], tols: Mapping[str, Tolerance]) -> Verdict:
    """Whether one implementation's errors ({output: error}) are within `tols`. An output it did not
    produce (missing or None) fails."""
    if not tols:
        return Verdict(False, None, None, "no outputs to check")
    worst, worst_ratio, reason = None, -1.0, ""
    for name, tol in tols.items():
        err = errors.get(name)
        if not finite(err):
            ratio = math.inf
            why = f"{name}: {'not produced' if err is None else 'non-finite error'}"
        else:
            ratio = err / tol.value if tol.value > 0 else (0.0 if err == 0 else math.inf)
            why = f"{name}: error {err:.3g} > tolerance {tol.value:.3g} ({tol.basis})"
        if ratio > worst_ratio:
            worst, worst_ratio, reason = name, ratio, why
    passed = worst_ratio <= 1.0
    return Verdict(passed, worst, worst_ratio, "" if passed else reason)
