"""Generated flash-attention kernels (forward and backward) over a frozen problem description
(spec.py); the sdpa templates (templates/attention*.py) build the description from a piece."""

from .backward import backward
from .forward import forward
from .spec import AttnSpec, BwdKnobs, Causal, Coords, FwdKnobs, MaskDropout, Operand, PhiloxDropout, Scalar, Source

__all__ = ["AttnSpec", "BwdKnobs", "Causal", "Coords", "FwdKnobs", "MaskDropout", "Operand", "PhiloxDropout",
           "Scalar", "Source", "backward", "forward"]
