"""Which tensors of a graph are images (N, C, spatial...), so that printing names their layout
(nchw, nhwc, ...) only where the graph says the axes mean that: the operands of convolutions,
pooling, batch/instance normalization and genstats, and the feature maps that pointwise ops carry
to and from them. Every other tensor prints as row-major or by its strides ([B, T, H] activations
are not 'ncw')."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .ir import Node
from .tensor import TensorDesc

# roles whose tensors are laid out as N, C, spatial...
IMAGE_ROLES: dict[str, tuple[str, ...]] = {
    "conv_fprop": ("image", "weight", "Y"),
    "conv_dgrad": ("loss", "filter", "DX"),
    "conv_wgrad": ("image", "loss", "DW"),
    "resample": ("input", "output", "index"),
    "resample_max_backward": ("grad", "input", "dx"),
    "resample_avg_backward": ("grad", "dx"),
    "batchnorm": ("input", "y"),
    "batchnorm_inference": ("input", "y"),
    "batchnorm_backward": ("grad", "input", "dx"),
    "instancenorm": ("input", "y"),
    "instancenorm_backward": ("grad", "input", "dx"),
    "genstats": ("input",),
}
ELEMENTWISE = ("pointwise", "custom", "stop_gradient")


def image_uids(nodes: Sequence[Node], tensors: Mapping[int, TensorDesc]) -> set[int]:
    found: set[int] = set()
    for n in nodes:
        roles = IMAGE_ROLES.get(n.kind)
        if roles is None:
            continue
        for role in roles:
            uid = n.input(role) if role in n.op.input_roles() else n.output(role)
            if isinstance(uid, int) and len(tensors[uid].dim) >= 3:
                found.add(uid)
    changed = True
    while changed:  # pointwise ops pass image-ness between operands of the full output dims
        changed = False
        for n in nodes:
            if n.kind not in ELEMENTWISE:
                continue
            outs = n.output_uids()
            if not outs:
                continue
            dims = tensors[outs[0]].dim
            group = [u for u in (*n.input_uids(), *outs) if tensors[u].dim == dims]
            if any(u in found for u in group):
                # and the broadcast operands of the same rank ([1, C, 1, 1] biases)
                group += [u for u in n.input_uids() if len(tensors[u].dim) == len(dims)]
                if not all(u in found for u in group):
                    found.update(group)
                    changed = True
    return found


def mark_images(nodes: Sequence[Node], tensors: dict[int, TensorDesc]) -> None:
    """Set `is_image` on the image tensors of `tensors` (in place)."""
    for uid in image_uids(nodes, tensors):
        tensors[uid] = dataclasses.replace(tensors[uid], is_image=True)
