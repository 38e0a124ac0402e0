"""Device time of every pointwise-template config of two GPT-2 training-step pieces, side by side on
one GPU (not a test: `python -m tests.engines.time_pointwise_pieces [ce] [tadd]`):

  ce    the cross-entropy backward over bf16 logits [8, 1024, 50304] (bench/gpt.py's dlogits): the
        flat walk (BLOCK) against the row walk (ROWS / COLS);
  tadd  the tied embedding's two fp32 gradients [50304, 768] added, one read transposed (TILE_I / TILE_J
        against BLOCK).

Each config's kernel is compiled by the Triton engine and timed as the autotuner times candidates
(opgraph.build.autotune.time_kernel: back-to-back launches behind a spin kernel, the median of
TUNE_PASSES measurements); its output
is compared with the first config's (the same math: bit-identical expected). Printed: the config as
plans print it, µs, the bytes moved over the time, and the floor at the device's bandwidth."""

from __future__ import annotations

import math
import statistics
import sys


def main(which: list[str], device: str = "cuda", small: bool = False) -> None:
    """`small` (and device "cpu"): tiny shapes, to try the script without a GPU."""
    import numpy as np

    from opgraph.build.autotune import TUNE_PASSES, _buffers, time_kernel
    from opgraph.core.config import HeurMode
    from opgraph.core.device import resolve_device
    from opgraph.core.piece import make_piece
    from opgraph.engines import get_engine

    from .test_triton_pointwise import _ce_backward, _transposed_add

    dev = resolve_device(device)
    engine = get_engine("triton")
    graphs = {
        "ce": lambda: _ce_backward((2, 3) if small else (8, 1024), 1000 if small else 50304),
        "tadd": lambda: _transposed_add(*((300, 260) if small else (50304, 768))),
    }
    name_of_device = "cpu"
    if dev.is_cuda:
        import torch

        name_of_device = torch.cuda.get_device_name()
    for name in which or list(graphs):
        final = graphs[name]().final
        piece = make_piece(final, 0, final.nodes)
        moved = sum(
            math.prod(piece.tensor(u).dim) * piece.tensor(u).data_type.itemsize
            for u in (*piece.inputs, *piece.outputs)
            if not piece.tensor(u).is_pass_by_value
        )
        print(f"== {name} on {name_of_device}: {moved / 1e9:.3f} GB moved", flush=True)
        bufs = _buffers(piece, dev)
        first = None
        for config in engine.configs(piece, dev, HeurMode.B):
            kernel = engine.compile(piece, config, dev)
            bufs[piece.outputs[0]][...] = float("nan")  # poisoned: every element must be written
            us = statistics.median(time_kernel(kernel, piece, dev, bufs) for _ in range(TUNE_PASSES))
            buf = bufs[piece.outputs[0]]
            out = buf.float().cpu().numpy() if dev.is_cuda else np.asarray(buf, np.float32)
            if first is None:
                first = out.copy()
            diff = float(np.abs(out - first).max())  # nan where an element was not written
            print(
                f"   {str(config).split(' (')[0]}: {us:8.1f} us  {moved / us / 1e6:6.2f} TB/s  max |diff| vs first {diff:.3g}",
                flush=True,
            )


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("-")], *(("cpu", True) if "--cpu" in sys.argv else ()))
