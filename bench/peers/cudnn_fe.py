"""The cuDNN frontend as a peer: one fused cuDNN graph per workload, built with its Python API.

    cuDNN FE heuristic   plans of heur_mode A (then FALLBACK); the first that builds (cuDNN's own pick)
    cuDNN FE tuned       every plan heur_modes A, B and FALLBACK offer (deduplicated by name), each built
                         and timed (device time), the fastest kept: cuDNN autotuned over all its plans

Both launch through the same backend call the `cudnn` engine of opgraph uses where the frontend
exposes it (`_backend_launcher`: no per-call Python re-inspection of the variant pack), else
`execute_plan_at_index`; the handle follows the caller's stream, so the suite's helper can capture it.

The tuned choice (the winning plan's name) is cached on disk by workload, shapes, frontend version and
device, as opgraph caches its own tuning: the repeats after the first build the winner only (the first
repeat's setup time shows the full tuning cost).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

from ..case import Ctx, Impl, Runner
from ..check import nan_fill

# building cuDNN's plans (runtime-fusion plans compile with NVRTC, ~1 s each): the cap per graph; a capped
# tuning says so in its notes and is not cached
TUNE_BUDGET_S = float(os.environ.get("OPGRAPH_BENCH_CUDNN_TUNE_S", 60))


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
    return {
        torch.float16: c.HALF,
        torch.bfloat16: c.BFLOAT16,
        torch.float32: c.FLOAT,
        torch.int32: c.INT32,  # (sequence lengths, ragged offsets)
        torch.int64: c.INT64,
    }[dtype]


Build = Callable[[Any, Mapping[str, Any]], Sequence[tuple[Any, Any]]]


class _Graph:
    """One cuDNN graph of the workload with its inputs bound by UID and fresh output buffers."""

    def __init__(self, inputs: Mapping[str, Any], build: Build, io_dtype: Any, modes: Sequence[str]) -> None:
        import torch

        cudnn = module()
        self.handle = _handle()
        g = cudnn.pygraph(
            io_data_type=_dt(io_dtype),
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=self.handle,
        )
        self.pack: dict[int, Any] = {}
        tensors: dict[str, Any] = {}
        uid = 1
        for name, t in inputs.items():
            by_value = t.device.type == "cpu" and t.numel() == 1
            tensors[name] = g.tensor(
                name=name,
                dim=list(t.shape),
                stride=list(t.stride()),
                data_type=_dt(t.dtype),
                is_pass_by_value=by_value,
                uid=uid,
            )
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

    def launcher(self, index: int, public: bool = False) -> Callable[[], None]:
        """A call running plan `index` (built) on the current stream: through the backend's own launch
        where the frontend exposes it, or (`public`) the frontend's execute_plan_at_index."""
        import torch

        cudnn, g, handle = module(), self.graph, self.handle
        ws = torch.empty(max(1, int(g.get_workspace_size_plan_at_index(index))), dtype=torch.uint8, device="cuda")
        fast = None
        try:
            from opgraph.engines.cudnn_frontend import _backend_launcher

            fast = None if public else _backend_launcher(g, index)
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


def cache_file() -> str:
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "opgraph"
    )
    return os.path.join(root, "bench_cudnn_fe_tuning.json")


def _cache_key(workload: str, inputs: Mapping[str, Any]) -> str:
    import torch

    shapes = ";".join(f"{k}:{list(t.shape)}:{list(t.stride())}:{t.dtype}" for k, t in inputs.items())
    return f"{workload}|{shapes}|{version()}|{torch.cuda.get_device_name()}"


def _cached_choice(key: str) -> str | None:
    try:
        with open(cache_file()) as f:
            return json.load(f).get(key)
    except (OSError, ValueError):
        return None


def _remember(key: str, name: str) -> None:
    path = cache_file()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        data[key] = name
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # no cache: the next process tunes again


def _engine(name: str, fast: bool, extra: str = "") -> str:
    return f"cuDNN {name[:48]}" + ("" if fast else " (public execute)") + (f"; {extra}" if extra else "")


def impls(
    ctx: Ctx,
    inputs: Mapping[str, Any],
    build: Build,
    io_dtype: Any,
    *,
    tune: bool | None = None,
    public: bool = False,
    views: Callable[[list[Any]], list[Any]] | None = None,
) -> list[Impl]:
    """The heuristic and tuned cuDNN frontend peers of a graph `build(g, {name: fe tensor})` that
    returns [(fe output tensor, torch dtype)] in the Case's output order (tuned unless ctx.tune is off).
    `public`: also the heuristic plan launched through the frontend's public execute_plan_at_index.
    `views`: the Case's outputs from the graph's output buffers (a ragged buffer's packed tokens), the
    comparison reading them after each check's call."""
    need = frozenset({"cuda", "cudnn_frontend"})
    tune = ctx.tune if tune is None else tune
    workload = ctx.workload

    def read(cg: _Graph) -> Callable[[Any], list[Any]] | None:
        return None if views is None else (lambda _ret: views(cg.outputs))

    def reset(cg: _Graph) -> Callable[[], None] | None:
        # (with `read`, a check poisons only what the call returned, here nothing: the buffers are)
        return None if views is None else (lambda: nan_fill(cg.outputs))

    def runner(cg: _Graph, call: Any, name: str, notes: str) -> Runner:
        return Runner(
            call=call,
            outputs=cg.outputs,
            read=read(cg),
            reset=reset(cg),
            engine=_engine(name, call.fast),
            keep=cg,
            notes=notes,
        )

    def heuristic(public: bool = False) -> Runner:
        cg = _Graph(inputs, build, io_dtype, ["A", "FALLBACK"])
        last: Exception | None = None
        for i, name in enumerate(cg.names):
            try:
                cg.graph.build_plan_at_index(i)
            except Exception as e:  # noqa: BLE001 - cuDNN's next plan
                last = e
                continue
            return runner(cg, cg.launcher(i, public), name, f"plan {i} of {len(cg.names)} (heur_mode A)")
        raise RuntimeError(f"none of cuDNN's {len(cg.names)} plans builds: {last}")

    def tuned() -> Runner:
        from .. import measure

        cg = _Graph(inputs, build, io_dtype, ["A", "B", "FALLBACK"])
        key = _cache_key(workload, inputs)
        cached = _cached_choice(key)
        if cached in cg.names:
            i = cg.names.index(cached)
            try:
                cg.graph.build_plan_at_index(i)
                note = f"the fastest of all plans in an earlier tuning (cached in {cache_file()})"
                return runner(cg, cg.launcher(i), cached, note)
            except Exception:  # noqa: BLE001 - the cached plan no longer builds: tune again
                pass
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
        _, i, name = min(timed, key=lambda t: t[0])
        call = cg.launcher(i)
        capped = len(seen) < len(set(cg.names))
        note = (
            f"fastest of {len(timed)} plans built ({len(seen)} distinct of {len(cg.names)} offered"
            + (f"; tuning stopped at {TUNE_BUDGET_S:.0f} s" if capped else "")
            + ")"
        )
        if not capped:
            _remember(key, name)
        return runner(cg, call, name, note)

    out = [Impl("cuDNN FE heuristic", heuristic, role="peer", tuned=False, needs=need)]
    if public:
        out.append(
            Impl("cuDNN FE heuristic (public execute)", lambda: heuristic(True), role="peer", tuned=False, needs=need)
        )
    if tune:
        out.append(Impl("cuDNN FE tuned", tuned, role="peer", tuned=True, needs=need))
    return out
