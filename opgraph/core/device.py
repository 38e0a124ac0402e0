"""Where a plan runs: the CPU, or one CUDA GPU (reached through PyTorch, imported only when asked)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

from .errors import GraphError


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" | "cuda"
    index: int = 0
    name: str = "cpu"
    capability: tuple[int, int] | None = None
    sm_count: int = 4  # multiprocessors: sizes grids (a few "programs" on the CPU interpreter)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch_name(self) -> str:
        """The device as PyTorch names it: "cpu" or "cuda:N"."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index} ({self.name})"


CPU = Device("cpu")


def cuda_usable() -> bool:
    """True when PyTorch is installed and sees a CUDA GPU."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(device: str | Device | None) -> Device:
    """None -> the current GPU when one is usable, else the CPU; "cpu", "cuda" (PyTorch's current
    device), "cuda:N" as named."""
    if isinstance(device, Device):
        return device
    if device is None:
        device = "cuda" if cuda_usable() else "cpu"
    text = str(device).strip().lower()
    if text == "cpu":
        return CPU
    if text.startswith("cuda"):
        if not cuda_usable():
            raise GraphError(
                f"device {device!r} was asked for but no CUDA GPU is usable here",
                rule="device.unavailable",
                hint="install PyTorch with CUDA on a machine with a GPU, or build with device='cpu'",
            )
        import torch

        # "cuda" is PyTorch's current device (torch.cuda.set_device: a data-parallel rank's own GPU)
        index = int(text.split(":", 1)[1]) if ":" in text else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return Device("cuda", index, props.name, (props.major, props.minor), props.multi_processor_count)
    raise GraphError(f"unknown device {device!r}", rule="device.unknown", hint="use 'cpu', 'cuda' or 'cuda:N'")
