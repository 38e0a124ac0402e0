"""bench.standby's core slots: each GPU's workers pinned to cores of their own (on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import standby


def test_core_slots_cut_the_cores_into_equal_disjoint_sets():
    slots = standby.core_slots(4, range(64))
    assert [len(s) for s in slots] == [16] * 4 and sorted(c for s in slots for c in s) == list(range(64))
    assert standby.core_slots(3, [0, 2, 4, 6, 8, 10, 12]) == [[0, 2], [4, 6], [8, 10]]
    assert standby.core_slots(2, [0, 1, 2]) is None  # one core a slot: no pinning
    assert standby.core_slots(4, range(7)) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_slots_worker_runs_on_its_cores_only():
    last = max(os.sched_getaffinity(0))
    pool = standby.StandbyPool(os.getcwd(), lambda gpu: dict(os.environ), [[last], [last]])
    proc = pool._popen(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        1,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == f"[{last}]"
    free = standby.StandbyPool(os.getcwd(), lambda gpu: dict(os.environ))  # no slots: the parent's cores
    proc = free._popen(
        [sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"], 0, stdout=subprocess.PIPE, text=True
    )
    assert int(proc.communicate(timeout=60)[0]) == len(os.sched_getaffinity(0))
