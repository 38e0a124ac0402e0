"""The cuDNN frontend as a peer: one fused cuDNN graph per workload, built with its Python API.

    cuDNN FE heuristic   plans of heur_mode A (then FALLBACK); the first that builds (cuDNN's own pick)
    cuDNN FE tuned       every plan heur_modes A, B and FALLBACK offer (deduplicated by name), each built
                         and timed (device time), the fastest kept: cuDNN autotuned over all its plans

Both launch through the same backend call the `cudnn` engine of opgraph uses where the frontend
exposes it (`_backend_launcher`: no per-call Python re-inspection of the variant pack), else
`execute_plan_at_index`; the handle follows the caller's stream, so the suite's helper can capture it.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Mapping, Sequence

from ..case import Impl, Runner

TUNE_BUDGET_S = 90.0  # building cuDNN's plans (runtime-fusion plans compile with NVRTC): cap per graph


def module() -> Any:
    import cudnn  # noqa: PLC0415 - optional peer

    return cudnn


@functools.lru_cache(maxsize=None)
def problem() -> str | None:
    try:
        cudnn = module()
        cudnn.backend_version()
    except Exception as e:  # noqa: BLE001 - absent or unloadable: the peer is reported unavailable
        return f"{type(e).__name__}: {e}"
    return None


def version() -> str | None:
    if problem():
        return None
    cudnn = module()
    return f"{getattr(cudnn, '__version__', '?')} (backend {cudnn.backend_version()})"


@functools.lru_cache(maxsize=None)
def _handle() -> Any:
    return module().create_handle()


def _dt(dtype: Any) -> Any:
    import torch

    c = module().data_type
    return {torch.float16: c.HALF, torch.bfloat16: c.BFLOAT16, torch.float32: c.FLOAT}[dtype]


Build = Callable[[Any, Mapping[str, Any]], Sequence[tuple[Any, Any]]]


class _Graph:
    """One cuDNN graph of the workload with its inputs bound by UID and fresh output buffers."""

    def __init__(self, inputs: Mapping[str, Any], build: Build, io_dtype: Any, modes: Sequence[str]) -> None:
        import torch

        cudnn = module()
        self.handle = _handle()
        g = cudnn.pygraph(io_data_type=_dt(io_dtype), intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        self.pack: dict[int, Any] = {}
        tensors: dict[str, Any] = {}
        uid = 1
        for name, t in inputs.items():
            by_value = t.device.type == "cpu" and t.numel() == 1
            tensors[name] = g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=_dt(t.dtype),
                                     is_pass_by_value=by_value, uid=uid)
            self.pack[uid] = t
            uid += 1
        outs = build(g, tensors)
        specs = []
        for fe, dtype in outs:
            fe.set_output(True).set_data_type(_dt(dtype)).set_uid(uid)
            specs.append((uid, fe, dtype))
            uid += 1
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in modes])
        g.check_support()
        self.outputs = []
        for u, fe, dtype in specs:
            buf = torch.empty_strided(tuple(fe.get_dim()), tuple(fe.get_stride()), dtype=dtype, device="cuda")
            self.pack[u] = buf
            self.outputs.append(buf)
        self.graph = g
        self.names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
        self._stream: Any = None

    def launcher(self, index: int) -> Callable[[], None]:
        """A call running plan `index` (built) on the current stream."""
        import torch

        cudnn, g, handle = module(), self.graph, self.handle
        ws = torch.empty(max(1, int(g.get_workspace_size_plan_at_index(index))), dtype=torch.uint8, device="cuda")
        fast = None
        try:
            from opgraph.engines.cudnn_frontend import _backend_launcher

            fast = _backend_launcher(g, index)
        except Exception:  # noqa: BLE001 - the public execute is the fallback
            fast = None
        ptrs = {u: t.data_ptr() for u, t in self.pack.items()}
        pack = self.pack
        state = self

        def call() -> None:
            raw = torch.cuda.current_stream().cuda_stream
            if raw != state._stream:
                cudnn.set_stream(handle=handle, stream=raw)
                state._stream = raw
            if fast is not None:
                lowered, cpp_index = fast
                lowered._execute_plan_at_index(ptrs, ws.data_ptr(), cpp_index, handle.backend_handle, None, None, None)
            else:
                g.execute_plan_at_index(pack, ws, index=index, handle=handle)

        call.fast = fast is not None  # type: ignore[attr-defined]
        call.ws = ws  # type: ignore[attr-defined]
        return call


def _engine(name: str, fast: bool, extra: str = "") -> str:
    return f"cuDNN {name[:48]}" + ("" if fast else " (public execute)") + (f"; {extra}" if extra else "")


def impls(inputs: Mapping[str, Any], build: Build, io_dtype: Any, *, tune: bool = True) -> list[Impl]:
    """The heuristic and tuned cuDNN frontend peers of a graph `build(g, {name: fe tensor})` that
    returns [(fe output tensor, torch dtype)] in the Case's output order."""
    need = frozenset({"cuda", "cudnn_frontend"})

    def heuristic() -> Runner:
        cg = _Graph(inputs, build, io_dtype, ["A", "FALLBACK"])
        last: Exception | None = None
        for i, name in enumerate(cg.names):
            try:
                cg.graph.build_plan_at_index(i)
            except Exception as e:  # noqa: BLE001 - cuDNN's next plan
                last = e
                continue
            call = cg.launcher(i)
            return Runner(call=call, outputs=cg.outputs, engine=_engine(name, call.fast), keep=cg,
                          notes=f"plan {i} of {len(cg.names)} (heur_mode A)")
        raise RuntimeError(f"none of cuDNN's {len(cg.names)} plans builds: {last}")

    def tuned() -> Runner:
        from .. import measure

        cg = _Graph(inputs, build, io_dtype, ["A", "B", "FALLBACK"])
        t0, seen, timed = time.perf_counter(), set(), []
        for i, name in enumerate(cg.names):
            if name in seen:
                continue
            seen.add(name)
            if time.perf_counter() - t0 > TUNE_BUDGET_S:
                break
            try:
                cg.graph.build_plan_at_index(i)
                call = cg.launcher(i)
                call()
                timed.append((measure.burst_us(call), i, name))
                del call  # its workspace: only the winner's is kept
            except Exception:  # noqa: BLE001 - a plan that does not build or run is not a candidate
                continue
        if not timed:
            raise RuntimeError(f"none of cuDNN's {len(cg.names)} plans builds and runs")
        us, i, name = min(timed, key=lambda t: t[0])
        call = cg.launcher(i)
        note = f"fastest of {len(timed)} plans built ({len(seen)} distinct of {len(cg.names)} offered)"
        return Runner(call=call, outputs=cg.outputs, engine=_engine(name, call.fast), keep=cg, notes=note)

    out = [Impl("cuDNN FE heuristic", heuristic, role="peer", tuned=False, needs=need)]
    if tune:
        out.append(Impl("cuDNN FE tuned", tuned, role="peer", tuned=True, needs=need))
    return out
