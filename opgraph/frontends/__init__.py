"""Front ends: build opgraph graphs from other frameworks' models.

`from_torch(module, example_inputs)` traces a PyTorch module with torch.export and translates it into
an opgraph `Graph` (see `opgraph.frontends.torch_import`). PyTorch is imported only when it is called,
so `import opgraph` stays free of it.

Inside PyTorch: `dynamo_backend` is the torch.compile backend (`backend="opgraph"`; AOTAutograd's
graphs imported by `fx_graph`, cut by `dynamo_partition`, backward ops in `aot_ops`, CUDA-graph
replay in `dynamo_cudagraphs`), `autograd_module` is `opgraph.compile` (forward and gradient plans in
a torch.autograd.Function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .torch_runtime import ImportedGraph


def from_torch(module: Any, example_inputs: Any, **options: Any) -> ImportedGraph:
    """Import a PyTorch module as an opgraph graph; see `opgraph.frontends.torch_import.from_torch`."""
    from .torch_import import from_torch as _from_torch

    return _from_torch(module, example_inputs, **options)


def __getattr__(name: str) -> Any:
    if name in ("ImportedGraph", "ImportReport", "ReportEntry"):
        from . import torch_runtime

        return getattr(torch_runtime, name)
    raise AttributeError(f"module 'opgraph.frontends' has no attribute '{name}'")


__all__ = ["ImportReport", "ImportedGraph", "ReportEntry", "from_torch"]
