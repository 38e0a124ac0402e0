"""bench.worker's bookkeeping, on the CPU."""

from __future__ import annotations

import json

from bench.core.floors import Ceilings
from bench.worker import shared_ceilings

META = {"device": "NVIDIA H200", "driver": "580", "hostname": "vm"}


def test_ceilings_are_measured_once_per_run_and_machine(tmp_path):
    """The first worker of a run measures the ceilings and keeps them beside the raw files; later workers
    of the run read them; a file from another machine (or a broken one) is measured over."""
    calls = []

    def measure(gbps):
        def now():
            calls.append(gbps)
            return Ceilings(gbps, {"float16": 700.0, "bfloat16": 710.0})

        return now

    raw = str(tmp_path / "repeat1-memory.json")
    first = shared_ceilings(raw, META, measure(2750.0))
    again = shared_ceilings(str(tmp_path / "repeat2-conv.json"), META, measure(9999.0))
    assert calls == [2750.0] and again == first and again.copy_gbps == 2750.0
    other = shared_ceilings(raw, {**META, "hostname": "other"}, measure(2600.0))
    assert other.copy_gbps == 2600.0 and calls == [2750.0, 2600.0]
    (tmp_path / "ceilings.json").write_text("{ broken")
    assert shared_ceilings(raw, META, measure(2700.0)).copy_gbps == 2700.0
    assert json.loads((tmp_path / "ceilings.json").read_text())["ceilings"]["copy_gbps"] == 2700.0
    assert shared_ceilings(None, META, measure(1.0)).copy_gbps == 1.0  # no raw file: measured here
