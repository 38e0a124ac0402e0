"""Workload modules. Each registers its workloads with `bench.core.registry.workload` on import;
`load()` imports those named in MODULES (and any in $OPGRAPH_BENCH_MODULES, comma-separated dotted
names: workloads kept outside this package)."""

from __future__ import annotations

import importlib
import os

MODULES = (
    "memory",
    "conv",
    "conv_backward",
    "matmul",
    "matmul_fp8",
    "networks",
    "training",
    "host",
    "attention",
    "attention_block",
    "attention_decode",
    "attention_llm",
    "training_gpt2",
    "zoo",
)


def load() -> None:
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
    for extra in filter(None, os.environ.get("OPGRAPH_BENCH_MODULES", "").split(",")):
        importlib.import_module(extra.strip())
