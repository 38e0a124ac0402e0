"""Build options: what `Graph.build` may be told, as one frozen, validated value.

`Graph.build(...)` takes them as keyword arguments (its public contract) or as
`options=BuildOptions(...)` (keywords given as well override those of `options`); the planner
(`plan_steps`) receives a BuildOptions, checked once here: an unknown keyword is a BuildOptionError
with a did-you-mean, a value of the wrong kind a BuildOptionError (or the filters' AttributeValueError)
naming the option.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.config import BehaviorNote, HeurMode, NumericalNote, as_modes
from ..core.device import Device
from ..core.errors import BuildOptionError
from ..core.suggest import did_you_mean
from .buckets import MAX_BUCKETS, check_spec
from .compile import MODES as COMPILE_MODES
from .filters import OPTIONS as FILTER_OPTIONS
from .filters import ConfigFilter

SHAPE_PLANS = 16  # default build(shape_plans=): a dynamic plan's per-shape plans kept (an LRU)


@dataclass(frozen=True)
class BuildOptions:
    """Every option of a build (see Graph.build for what each does).

    heur_mode        heuristic modes, in order (HeurMode values or names; default A)
    device           "cpu", "cuda", "cuda:N" or a Device; None: CUDA where a GPU is usable, else the CPU
    engines          engine names in order of preference; None: the device's default list
    allow_partition  split the graph where no engine runs it whole (False: one piece or an error)
    autotune         time the candidate configs on the device instead of trusting the ranking
    by_reference     every bound tensor read through the plan's address table
    compile          "parallel", "serial" or "lazy" (when and where kernels compile)
    select_* / deselect_*  cuDNN's config filters (opgraph.build.filters.ConfigFilter)
    buckets          a dynamic graph's buckets (opgraph.build.buckets): None (the default policy),
                     "one", or {dim name: [upper ends]}; kept as (name, ends) pairs
    max_buckets      the most buckets the default policy makes (default 8)
    shape_plans      a dynamic plan's per-shape plans kept, each with its internal CUDA graph (an LRU;
                     default 16)
    """

    heur_mode: HeurMode | str | Sequence[HeurMode | str] | None = None  # kept as a tuple of HeurMode
    device: str | Device | None = None
    engines: Sequence[str] | None = None  # kept as a tuple
    allow_partition: bool = True
    autotune: bool = False
    by_reference: bool = False
    compile: str = "parallel"
    select_numeric_notes: frozenset[NumericalNote] = frozenset()
    deselect_numeric_notes: frozenset[NumericalNote] = frozenset()
    select_behavior_notes: frozenset[BehaviorNote] = frozenset()
    deselect_behavior_notes: frozenset[BehaviorNote] = frozenset()
    deselect_engines: frozenset[str] = frozenset()
    deselect_workspace_greater_than: int | None = None
    buckets: str | Mapping[str, Sequence[int]] | tuple[tuple[str, tuple[int, ...]], ...] | None = None
    max_buckets: int = MAX_BUCKETS
    shape_plans: int = SHAPE_PLANS

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("heur_mode", as_modes(self.heur_mode))
        if self.device is not None and not isinstance(self.device, (str, Device)):
            raise BuildOptionError(
                f"build option device={self.device!r} is not a device",
                rule="build.option",
                hint="pass 'cpu', 'cuda', 'cuda:N', an opgraph Device, or None",
            )
        engines = self.engines
        if engines is not None:
            engines = (engines,) if isinstance(engines, str) else tuple(engines)
            if not all(isinstance(e, str) for e in engines):
                raise BuildOptionError(
                    f"build option engines={self.engines!r} must name engines",
                    rule="build.option",
                    hint="pass engine names, e.g. ['triton', 'torch']",
                )
        put("engines", engines)
        for name in ("allow_partition", "autotune", "by_reference"):
            value = getattr(self, name)
            if type(value) is not bool and value not in (0, 1):
                raise BuildOptionError(
                    f"build option {name}={value!r} is not True or False",
                    rule="build.option",
                    hint=f"pass {name}=True or {name}=False",
                )
            put(name, bool(value))
        if self.compile not in COMPILE_MODES:
            raise BuildOptionError(
                f"build option compile={self.compile!r} is not a compile mode",
                rule="build.compile",
                hint=f"use one of {', '.join(COMPILE_MODES)}",
            )
        put("buckets", check_spec(self.buckets))
        for name, default in (("max_buckets", MAX_BUCKETS), ("shape_plans", SHAPE_PLANS)):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise BuildOptionError(
                    f"build option {name}={value!r} is not a positive int",
                    rule="build.option",
                    hint=f"pass {name}={default} (the default), or another count >= 1",
                )
        filters = ConfigFilter.from_options({name: getattr(self, name) for name in FILTER_OPTIONS})
        for name in FILTER_OPTIONS:
            put(name, getattr(filters, name))

    @property
    def modes(self) -> tuple[HeurMode, ...]:
        return as_modes(self.heur_mode)

    @functools.cached_property
    def filters(self) -> ConfigFilter:
        """The config filters of these options (applied to heuristics and autotuning alike; made once: a
        dynamic plan asks at every step of every new shape)."""
        return ConfigFilter(*(getattr(self, name) for name in FILTER_OPTIONS))

    def replace(self, **keywords: Any) -> BuildOptions:
        """These options with some changed (checked as the constructor checks them)."""
        check_names(keywords)
        return dataclasses.replace(self, **keywords)

    @staticmethod
    def of(options: BuildOptions | None = None, **keywords: Any) -> BuildOptions:
        """`options` (default: all defaults) with `keywords` applied over it."""
        if options is not None and not isinstance(options, BuildOptions):
            raise BuildOptionError(
                f"options={options!r} is not a BuildOptions",
                rule="build.option",
                hint="pass options=opgraph.BuildOptions(...), or the options as keywords",
            )
        check_names(keywords)
        return dataclasses.replace(options, **keywords) if options is not None else BuildOptions(**keywords)

    def as_keywords(self) -> dict[str, Any]:
        """The options as Graph.build's keyword arguments (those that differ from the defaults)."""
        default = _DEFAULT
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


NAMES = tuple(f.name for f in dataclasses.fields(BuildOptions))
_DEFAULT = BuildOptions()


def check_names(keywords: Mapping[str, Any]) -> None:
    """A BuildOptionError naming the first keyword that is no build option (with a did-you-mean)."""
    for name in keywords:
        if name not in NAMES:
            raise BuildOptionError(
                f"build() has no option {name!r}{did_you_mean(str(name)[:100], NAMES)}",
                rule="build.option",
                hint=f"the options are {', '.join(NAMES)} (opgraph.BuildOptions)",
            )


def merged(options: BuildOptions | None, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> BuildOptions:
    """Graph.build's options: `options` with each keyword in `given` applied over it, where a named
    parameter (in `defaults`) counts as given when it differs from its default."""
    changes = {k: v for k, v in given.items() if k not in defaults or not _same(v, defaults[k])}
    return BuildOptions.of(options, **changes)


def _same(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


__all__ = ["BuildOptions", "NAMES", "check_names", "merged"]
