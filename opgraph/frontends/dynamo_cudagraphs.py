"""CUDA-graph replay for the torch.compile backend (options={"cudagraphs": True}, or
mode="reduce-overhead"): each compiled forward and backward graph, opgraph plans and PyTorch fallbacks
alike, is recorded and replayed by PyTorch's CUDA graph trees (torch._inductor.cudagraph_trees), as
PyTorch's own "cudagraphs" backend does with an uncompiled graph: static input copies for the
activations, parameters read in place, outputs from a private memory pool (overwritten by a later
replay, as mode="reduce-overhead" documents). Graphs that cannot be captured (CPU tensors, several
devices, input mutations) run without, and PyTorch logs why.

This follows torch/_dynamo/backends/cudagraphs.py step for step, with opgraph's compiled graph where
that backend has the FX graph itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("opgraph.dynamo")

Compiler = Callable[[Any, list[Any]], Any]


def with_cudagraphs(
    forward: Compiler, backward: Compiler, inference: Compiler, dynamo_inputs: int
) -> tuple[Compiler, Compiler, Compiler]:
    """The three AOTAutograd compilers wrapped so that what they compile replays as CUDA graphs.
    `dynamo_inputs`: how many inputs the Dynamo graph has (the forward's leading, fixed ones)."""
    import torch

    try:  # PyTorch's private CUDA-graph machinery: without it (another version), run without CUDA graphs
        from torch._dynamo.backends.cudagraphs import (
            check_for_skip,
            find_input_mutations,
            get_device_index,
            get_stack_traces,
        )
        from torch._inductor.cudagraph_trees import cudagraphify_impl
        from torch._inductor.cudagraph_utils import (
            BoxedDeviceIndex,
            get_placeholder_info,
            log_cudagraph_skip_and_bump_counter,
        )
        from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments
    except ImportError as err:
        log.warning("opgraph: CUDA graphs are off: this PyTorch lacks what they use (%s)", err)
        return forward, backward, inference

    do_cudagraphs = BoxedBool(True)
    device_index = BoxedDeviceIndex(None)

    def wrap_forward(compiler: Compiler, is_inference: bool) -> Compiler:
        def compile_forward(aot_model: Any, aot_inputs: list[Any]) -> Any:
            fixed = num_fw_fixed_arguments(dynamo_inputs, len(aot_inputs))
            skip = check_for_skip(aot_model, fixed)
            # read before compiling: opgraph fuses the graph's nodes into partitions in place
            placeholders = get_placeholder_info(aot_model.graph)
            traces, mutated = get_stack_traces(aot_model), find_input_mutations(aot_model.graph)
            index = get_device_index(aot_model) if not skip else None
            compiled = compiler(aot_model, aot_inputs)
            if skip:
                BoxedBool.disable(do_cudagraphs)
                log_cudagraph_skip_and_bump_counter(f"skipping cudagraphs due to {skip}")
                return compiled
            _reserve(compiled)  # (only where the trees record: the plans then release each call's buffers)
            device_index.set(index)
            out = cudagraphify_impl(
                compiled,
                aot_inputs,
                range(fixed),
                device_index=device_index.value,
                is_backward=False,
                is_inference=is_inference,
                stack_traces=traces,
                placeholders=placeholders,
                mutated_input_idxs=mutated,
            )
            out._boxed_call = True  # type: ignore[attr-defined]
            return out

        return compile_forward

    def compile_backward(aot_model: Any, aot_inputs: list[Any]) -> Any:
        fixed = count_tangents(aot_model)
        skip = check_for_skip(aot_model, fixed)
        placeholders = get_placeholder_info(aot_model.graph)
        traces, mutated = get_stack_traces(aot_model), find_input_mutations(aot_model.graph)
        index = get_device_index(aot_model) if not skip else None
        compiled = backward(aot_model, aot_inputs)
        if not do_cudagraphs:
            return compiled
        if skip:
            log_cudagraph_skip_and_bump_counter(f"skipping cudagraphs due to {skip}")
            manager = torch._inductor.cudagraph_trees.get_manager(device_index.value or 0, create_if_none_exists=False)
            if manager is None:
                return compiled

            def run(inputs: list[Any]) -> Any:
                manager.set_to_running_backward()
                return compiled(inputs)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run
        _reserve(compiled)
        out = cudagraphify_impl(
            compiled,
            aot_inputs,
            range(fixed),
            device_index=index,
            is_backward=True,
            is_inference=False,
            stack_traces=traces,
            placeholders=placeholders,
            mutated_input_idxs=mutated,
        )
        out._boxed_call = True  # type: ignore[attr-defined]
        return out

    return wrap_forward(forward, False), compile_backward, wrap_forward(inference, True)


def _reserve(compiled: Any) -> None:
    """The compiled graph's plans allocate their per-thread workspaces now, outside the CUDA graph tree's
    pool: allocated in its warmup, they would be live blocks of the pool that are no output, which the
    tree refuses when it records."""
    reserve = getattr(compiled, "reserve", None)
    if reserve is not None:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # (AOTAutograd compiles under a fake mode: real buffers, not fakes)
            reserve()
