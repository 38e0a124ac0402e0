"""Normalizations: batchnorm (training, inference, backward), layernorm, rmsnorm, instancenorm."""

from __future__ import annotations

import enum


class NormForwardPhase(enum.Enum):
    TRAINING = "training"
    INFERENCE = "inference"
