"""Generated flash-attention kernels (forward and backward) over a frozen problem description
(spec.py), as the engine's `Generated` (templates/base.py: the module, its launches and scratch); the sdpa
templates (templates/attention*.py) build the description from a piece. Kernel parameters are named as
everywhere in the engine: p{uid} a buffer, s{uid} a pass-by-value scalar, the scratch buffers by name."""

from .backward import backward
from .forward import forward
from .spec import AttnSpec, BwdKnobs, Causal, Coords, FwdKnobs, MaskDropout, Operand, PhiloxDropout, Scalar

__all__ = [
    "AttnSpec",
    "BwdKnobs",
    "Causal",
    "Coords",
    "FwdKnobs",
    "MaskDropout",
    "Operand",
    "PhiloxDropout",
    "Scalar",
    "backward",
    "forward",
]
