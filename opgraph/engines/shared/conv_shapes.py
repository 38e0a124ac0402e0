"""A convolution's shape as the engines and the build's ranking policy see it, and the channel
thresholds they share: the generated kernels decide their configs by them, the policy (opgraph.build
.policy) which engine leads, and both must agree (measurements: bench/results/constants.md#conv-shapes)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.ir import Node
from ...core.piece import Piece
from ...core.tensor import TensorDesc

CONV_KINDS = frozenset({"conv_fprop", "conv_dgrad", "conv_wgrad"})
# channels per group below which a generated implicit GEMM pads most of its K tile: an fp16/bf16 MMA is
# 16 deep, so a group of C/g channels uses C/g of its 16 lanes
NARROW_GROUP = 16
# channels per group below which a convolution is a stem's (RGB, RGBA, padded to 4): the generated
# kernels' MERGE_TAPS configs run K lanes over a filter row's taps and channels together
FEW_CHANNELS = 8


@dataclass(frozen=True)
class ConvShape:
    """A convolution node's image (fprop and wgrad: its input X; dgrad: its result DX) and filter
    (fprop and dgrad: W; wgrad: its result DW), of dims [N, C, spatial...] and [K, C/groups, taps...]."""

    kind: str
    image: TensorDesc
    weight: TensorDesc

    @property
    def channels_per_group(self) -> int:
        return self.weight.dim[1]

    @property
    def depthwise(self) -> bool:
        """One input channel per group."""
        return self.channels_per_group == 1

    @property
    def grouped(self) -> bool:
        return self.image.dim[1] > self.channels_per_group

    @property
    def filter_row(self) -> int:
        """Taps on the filter's last spatial axis."""
        return self.weight.dim[-1]


def conv_shape(piece: Piece, node: Node) -> ConvShape:
    """The shape of convolution `node` (one of CONV_KINDS) of `piece`."""
    weight = node.output_uids()[0] if node.kind == "conv_wgrad" else node.input_uids()[1]
    image = node.output_uids()[0] if node.kind == "conv_dgrad" else node.input_uids()[0]
    return ConvShape(node.kind, piece.tensor(image), piece.tensor(weight))
