"""An internal CUDA graph of a bound plan, replayed while nothing it baked in changes.

Flat launching (bound.py) costs the driver's launch per kernel, a few µs of host time each; a plan of
hundreds of steps costs a millisecond or more. When a bound plan has run `AFTER` times in a row with
the same addresses and scalar values (a training loop over the same buffers, new data written into
them), its launches are captured once into a CUDA graph and later executes replay it: one launch for
the whole plan. Replays see what the flat launches would: buffer contents, device scalars
(1-element tensors) and the address table are read at run time, so data written between executes,
a learning-rate schedule and by-reference tensors moved through the table (`set_address`, or a pack
whose only moved tensors are table-addressed) all take effect without a new capture. A moved buffer
that a launch holds by address, a new pass-by-value scalar or another workspace drops the graph; the
plan launches flat until it is stable again.

On by default since the GPU tier passed with it (bench/results/constants.md#auto-graph);
`plan.auto_graph = False` on a plan, or
OPGRAPH_AUTOGRAPH=0 when plans are built, launches flat. The capture is thread-local (other threads'
CUDA calls go on) and, like any torch.cuda.graph capture, synchronizes the device once; a binding that
keeps changing stops being captured after MAX_CAPTURES graphs. A plan executed by more than one
thread is never captured (PyTorch's one CUDA generator per process is registered with a capture, and
another thread drawing random numbers meanwhile breaks it), and one capture runs at a time. Only plans whose every step is CUDA_GRAPH_CAPTURABLE are captured,
never inside a capture of the caller's own. A capture that fails turns the feature off for that
binding (flat launches, as without it). The graph's memory pool holds the temporaries of steps that
run through PyTorch, for the binding's life.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from ..core.config import BehaviorNote

log = logging.getLogger("opgraph.runtime")
AFTER = 2  # executes with nothing changed before the capture
MAX_CAPTURES = 8  # graphs per binding: one whose buffers keep moving launches flat from then on
# one capture at a time in the process: PyTorch registers its one CUDA generator with each capture
_CAPTURING = threading.Lock()


class AutoGraph:
    """One bound plan's internal graph (bound.BoundPlan.autograph)."""

    def __init__(self, bound: Any) -> None:
        state = bound.state
        # (a proxy: the bound plan owns this object, and a cycle between them would leave every
        # per-shape plan a dynamic plan drops to the garbage collector's full passes)
        self.bound = weakref.proxy(bound)
        self.enabled = state.device.is_cuda and all(
            BehaviorNote.CUDA_GRAPH_CAPTURABLE in s.config.behavior_notes for s in state.steps
        )
        self.graph: Any = None
        self.stable = 0
        self.captures = 0
        self.replays = 0

    def invalidate(self) -> None:
        self.graph = None
        self.stable = 0

    def run(self, wanted: bool = True) -> bool:
        """Replay (capturing first when the binding has been stable) and answer True, or False: the
        caller launches flat. `wanted`: the plan's `auto_graph`. Runs on PyTorch's current stream,
        which the caller made the execute's."""
        if not self.enabled or not wanted:
            return False
        if self.bound.state.threads.shared:  # see state.ThreadCount
            self.enabled = False
            self.graph = None
            return False
        import torch

        if torch.cuda.is_current_stream_capturing():
            return False
        if self.graph is None:
            self.stable += 1
            if self.stable <= AFTER:
                return False
            if self.captures >= MAX_CAPTURES:
                log.info(
                    "plan '%s': its binding changed after each of %d graphs; launching one by one",
                    self.bound.state.graph.name,
                    self.captures,
                )
                self.enabled = False
                return False
            if not _CAPTURING.acquire(blocking=False):  # another thread is capturing: flat this time
                return False
            try:
                captured = self._capture(torch)
            finally:
                _CAPTURING.release()
            if not captured:
                return False
        self.graph.replay()
        self.replays += 1
        return True

    def _capture(self, torch: Any) -> bool:
        bound = self.bound
        slot = bound.binding.stream
        before = slot.handle
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                slot.set(bound.state.streams.current())  # the capture stream
                bound.run()
        except Exception as err:  # noqa: BLE001 - launch flat from now on, as without graphs
            log.warning(
                "plan '%s': capturing its launches failed (%s: %s); launching them one by one",
                bound.state.graph.name,
                type(err).__name__,
                err,
            )
            self.enabled = False
            return False
        finally:
            slot.set(before)
        self.graph = graph
        self.captures += 1
        return True


def default() -> bool:
    """Whether new plans replay internal graphs: yes, unless OPGRAPH_AUTOGRAPH is 0 (or false, no, off)."""
    import os

    return os.environ.get("OPGRAPH_AUTOGRAPH", "").strip().lower() not in ("0", "false", "no", "off")
