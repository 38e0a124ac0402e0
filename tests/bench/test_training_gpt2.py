"""The GPT-2 training-step workload's dry run on the CPU (tiny model, reference engine, eager PyTorch):
the step is checked output by output (loss, every gradient read from AdamW's first moment, every
updated parameter) against the float64 step, for opgraph and the eager peer alike."""

from __future__ import annotations

import pytest

from .helpers import assert_step_checked, dry_run_step


@pytest.mark.slow
def test_dry_run_of_the_gpt2_training_step(tmp_path):
    w, names, n_params = dry_run_step(tmp_path, "training-gpt2")
    assert names[0] == "loss" and n_params == 28 and len(names) == 1 + 2 * n_params  # 2 layers, tied embedding
    impls = assert_step_checked(w, names, 0.05)
    assert impls["torch.compile"]["status"] == "unavailable"
