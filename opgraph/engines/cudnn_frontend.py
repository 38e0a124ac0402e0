"""The cuDNN frontend engine ("cudnn"): a piece lowered to one cuDNN frontend graph
(`pip install nvidia-cudnn-frontend`), so that cuDNN's own fused kernels (runtime-fusion conv with
its epilogue, conv + genstats, dgrad + drelu) compete with the generated ones.

opgraph's ops and their argument names are cuDNN frontend's, so lowering (cudnn_lowering.py) is a table: each node
becomes the pygraph call of the same name with the same roles; literals become compile-time
scalars; piece inputs and outputs keep their UIDs, dims, strides and types; intermediates are
virtual tensors of their declared type. A piece is offered to cuDNN only around an fp16/bf16 convolution or matmul with an fp16/bf16/fp32
result, no DOUBLE tensor or compute type and no by-reference tensor; cuDNN's own support check (its heuristics query) then decides, and its message is the reason a piece is declined. Verdicts are cached per
piece signature, since the partitioner and the heuristics ask about the same pieces many times.

Configs are cuDNN's execution plans: heuristic mode A (and INSTANT) offers cuDNN's first plan for
heur_mode.A, B its first `B_PLANS` plans, so that `build(autotune=True)` times them against the
generated kernels; FALLBACK offers none (the torch engine is the fallback that always works, and
asking cuDNN twice per piece would double the planning time of a network). Knobs name the cuDNN
heuristic and plan (`heuristic`, `plan`: its position, `name`: cuDNN's name for it, checked when a
plan file is compiled again). The plan's workspace is the kernel's scratch; the handle runs on the
caller's stream. cuDNN bakes buffer addresses into its launches (no SUPPORTS_CUDA_GRAPH_NATIVE_API):
update_cuda_graph re-captures such steps.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, ExecutionError
from ..core.ir import Const, Node
from ..core.piece import Piece
from ..core.torch_interop import as_torch
from ..core.types import Buffer, Stream, UidPack
from ..ops.attention import SdpaBackward
from ..ops.conv import _Conv
from ..ops.pointwise import Pointwise, PointwiseMode
from . import artifacts, cudnn_launch, register_engine
from .base import Engine, EngineFacts, Kernel, PieceFact
from .cost import estimate_us
from .cudnn_lowering import (
    GEMM_KINDS,
    PARAM_METHODS,
    Lowering,
    canonical_extras,
    canonical_uids,
    cudnn_module,
)
from .cudnn_padded import EXTRA_UIDS, PaddedForm, lengths, padded_form, sections
from .cudnn_sdpa import (
    ATTENTION_KINDS,
    MOVES,
    attention_problem,
    attention_views,
    operand_slots,
)
from .shared.conv_shapes import CONV_KINDS

log = logging.getLogger("opgraph.cudnn")
ANCHORS = GEMM_KINDS | ATTENTION_KINDS  # what cuDNN builds fused graphs around, as this engine offers them
OTHER_KINDS = frozenset({"pointwise", "genstats", "reduction"})
# GEMM operand types offered to cuDNN: the fp16 configurations benchmarked and tested on the H100; an
# fp32 training graph gave NaN losses through cuDNN plans, so FLOAT pieces stay with the generated
# kernels (bench/results/constants.md#cudnn-gemm-types).
GEMM_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})
# ... and the result types its GEMM engines write. Nothing in a piece offered to cuDNN is DOUBLE (a
# tensor or a compute type): its fused engines compute in fp32 at most, and an fp16 matmul with a
# DOUBLE output that cuDNN accepted came back NaN (bench/results/constants.md#cudnn-gemm-types).
GEMM_OUT_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16, DataType.FLOAT})
B_PLANS = 4


class Declined(Exception):
    """A piece the lowering cannot express in cuDNN's graph API (the message says why)."""


@functools.cache
def _import_problem() -> str | None:
    if importlib.util.find_spec("cudnn") is None:
        return "the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend)"
    try:
        cudnn_module().backend_version()
    except Exception as err:  # noqa: BLE001 - any failure to load cuDNN is a reason, not a crash
        return f"the cuDNN frontend cannot load cuDNN: {type(err).__name__}: {err}"
    return None


@functools.cache
def _handle(index: int) -> Any:
    import torch

    with torch.cuda.device(index):
        return cudnn_module().create_handle()


def static_problem(piece: Piece) -> tuple[str, Node | None] | None:
    """Why the piece cannot be lowered, without asking cuDNN (None: it can be)."""
    if not any(n.kind in ANCHORS for n in piece.nodes):
        return (
            "the cudnn engine runs pieces around a convolution or matmul (or attention); generated kernels "
            "serve the rest"
        ), None
    for uid in (*piece.inputs, *piece.outputs):
        t = piece.tensor(uid)
        if t.is_by_reference:
            return (
                f"{t.label()} is by reference: cuDNN bakes buffer addresses into its launches, generated "
                "kernels read them from the plan's address table",
                None,
            )
    views = attention_views(piece)
    if isinstance(views, str):
        return views, None
    for node in piece.nodes:
        if views is not None and node.kind in MOVES:
            continue
        why = _double_problem(piece, node)
        if why:
            return why, node
        if node.kind in GEMM_KINDS:
            types = {piece.tensor(u).data_type for u in node.input_uids()}
            if not types <= GEMM_TYPES:
                return (
                    f"the cudnn engine offers fp16/bf16 {node.kind} only (operands "
                    f"{', '.join(sorted(t.name for t in types))})",
                    node,
                )
            out = piece.tensor(node.output_uids()[0])
            if out.data_type not in GEMM_OUT_TYPES:
                return (
                    f"the cudnn engine offers {node.kind} with an fp16/bf16/fp32 result only "
                    f"({out.label()} is {out.data_type.name})",
                    node,
                )
        if node.kind not in ANCHORS | OTHER_KINDS:
            return f"cuDNN's graph API has no {node.kind} op here", node
        if set(node.output_uids()) & set(node.input_uids()) or set(node.output_uids()) & set(piece.inputs):
            return "an in-place update (an output with its input's UID) is not a cuDNN graph", node
        if node.kind in GEMM_KINDS - {"matmul"} and node.op_as(_Conv).convolution_mode.name != "CROSS_CORRELATION":
            return "cuDNN runs CROSS_CORRELATION convolutions only", node
        if node.kind == "pointwise":
            why = _pointwise_problem(node)
            if why:
                return why, node
        if node.kind in ATTENTION_KINDS:
            why = attention_problem(node, piece)
            if why:
                return why, node
    return _whole_problem(piece)


def _whole_problem(piece: Piece) -> tuple[str, Node | None] | None:
    """static_problem's checks of the piece as a whole: its scalars' types, its GEMMs' dependence."""
    for uid in piece.inputs:
        t = piece.tensor(uid)
        if t.is_pass_by_value and t.data_type is not DataType.FLOAT:
            return f"pass-by-value scalar '{t.name}' (UID {uid}) is {t.data_type.name}; cuDNN's are FLOAT", None
    side = _side_by_side(piece)
    if side is not None:
        return (
            "two products that do not feed each other (the same operand times two others) are not one cuDNN "
            "graph here: the generated matmul template computes them side by side",
            side,
        )
    return None


def _side_by_side(piece: Piece) -> Node | None:
    """A GEMM of the piece that neither reads another GEMM's result nor is read by one (through the
    piece's other ops), where there are several: None where the GEMMs form a chain. A graph of two
    independent products (a Llama block's query and key projections of one input) gave wrong results
    from cuDNN's plan where a build merged them (bench/results/constants.md#independent-products)."""
    gemms = [n for n in piece.nodes if n.kind in GEMM_KINDS]
    if len(gemms) < 2:
        return None
    index = {id(g): i for i, g in enumerate(gemms)}
    feeds: dict[int, set[int]] = {}  # gemm index -> the GEMMs its result reaches
    for i, g in enumerate(gemms):
        reached, found = set(g.output_uids()), set()
        for node in piece.nodes:  # (topological order)
            if reached & set(node.input_uids()):
                reached |= set(node.output_uids())
                if id(node) in index:
                    found.add(index[id(node)])
        feeds[i] = found
    for i, g in enumerate(gemms):
        if not feeds[i] and not any(i in feeds[j] for j in feeds):
            return g
    return None


def _double_problem(piece: Piece, node: Node) -> str | None:
    """Why cuDNN cannot give `node` the float64 precision it asks for (see GEMM_OUT_TYPES), or None."""
    if node.compute_data_type is DataType.DOUBLE:
        return "it computes in DOUBLE; cuDNN's fused engines compute in fp32 at most"
    for uid in (*node.input_uids(), *node.output_uids()):
        t = piece.tensor(uid)
        if t.data_type is DataType.DOUBLE:
            return f"{t.label()} is DOUBLE; cuDNN's fused engines compute and store fp32 at most"
    return None


def _pointwise_problem(node: Node) -> str | None:
    op = node.op_as(Pointwise)
    mode = op.mode
    if mode.name == "GEN_INDEX":
        return "gen_index is left to generated kernels"
    method = mode.value
    defaults = dict(op.info.params)
    for role, default in defaults.items():
        value = node.input(role)
        if value is None:
            continue
        if not isinstance(value, Const):
            return f"cuDNN's {method} takes its {role} as a number, not a tensor"
        if method not in PARAM_METHODS and value.value != default:
            return f"cuDNN's {method} has no {role} parameter ({role}={value.value} here)"
    return None


def _plans(piece: Piece, device: Device, heuristic: str, padded: PaddedForm | None = None) -> tuple[Any, list[str]]:
    """The piece's cuDNN graph planned with `heuristic` (in the padded form at the bucket's largest
    shape where `padded` is given), and its plans' names (ranked)."""
    cudnn = cudnn_module()
    lowered = Lowering(padded.largest if padded is not None else piece, _handle(device.index), padded)
    g = lowered.graph
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([getattr(cudnn.heur_mode, heuristic)])
    g.check_support()
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    if not names:
        raise Declined(f"cuDNN's heuristic {heuristic} offers no plan for it")
    return lowered, names


def _backend_launcher(graph: Any, index: int) -> tuple[Any, int] | None:
    """(the lowered C++ graph, the plan's index in it) when plan `index` is a backend plan, so that
    `run` can launch it with a map of UIDs to addresses: the frontend's public execute re-inspects
    every buffer in Python on each call (tens of µs, more than a small conv takes). None (use the
    public execute) for the frontend's Python-engine plans or a frontend without these internals."""
    try:
        if graph._engine_for(graph._plans[index]) is not None:
            return None
        cpp_index = graph._materialize_backend_plan(index).cpp_index
        lowered = graph._lowered_graph
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    if cpp_index is None or not hasattr(lowered, "_execute_plan_at_index"):
        return None
    return lowered, int(cpp_index)


_VERDICTS: dict[tuple[str, int], tuple[str | None, list[str]]] = {}


def padded(piece: Piece) -> PaddedForm | None:
    """The piece's padded form (one plan for its bucket: cudnn_padded), None where it runs as it is."""
    form = padded_form(piece)
    return form if isinstance(form, PaddedForm) else None


def plan_signature(piece: Piece, form: PaddedForm | None) -> str:
    """What keys the piece's cuDNN plans and verdicts: the piece's signature, or in the padded form its
    signature at the bucket's largest shape, marked."""
    return piece.signature() if form is None else f"padded:{form.largest.signature()}"


def _verdict(piece: Piece, device: Device) -> tuple[str | None, list[str]]:
    """(why cuDNN declines the piece or None, its plan names), asked once per piece signature and
    environment (kept on disk across processes: cudnn_launch.Verdicts)."""
    form = padded(piece)
    key = (plan_signature(piece, form), device.index)
    if key not in _VERDICTS:
        disk_key = cudnn_launch.verdict_key(key[0], device.index)
        found = cudnn_launch.VERDICTS.get(disk_key)
        if found is None:
            try:
                found = (None, _plans(piece, device, "A", form)[1])
            except Exception as err:  # noqa: BLE001 - cuDNN's refusal, in its words
                text = (str(err).strip().splitlines() or [""])[0][:300]
                found = (f"cuDNN declines it: {type(err).__name__}: {text}", [])
            cudnn_launch.VERDICTS.put(disk_key, found)
        _VERDICTS[key] = found
    return _VERDICTS[key]


def _notes(piece: Piece) -> tuple[frozenset[NumericalNote], frozenset[BehaviorNote]]:
    tensors = piece.graph.tensors
    numerical: set[NumericalNote] = set()
    for n in piece.nodes:
        if n.kind in GEMM_KINDS:
            a = tensors[n.input_uids()[0]].data_type
            numerical.add(NumericalNote.TENSOR_CORE if a.itemsize <= 2 else NumericalNote.DOWN_CONVERT_INPUTS)
        if n.kind in ("conv_dgrad", "conv_wgrad"):
            numerical.add(NumericalNote.NONDETERMINISTIC)  # cuDNN may pick split-K with atomics
        if n.kind in ATTENTION_KINDS:
            numerical.add(NumericalNote.TENSOR_CORE)
            if n.kind == "sdpa_backward" and not n.op_as(SdpaBackward).use_deterministic_algorithm:
                numerical.add(NumericalNote.NONDETERMINISTIC)  # dQ accumulated with atomics
    behavior = {BehaviorNote.CUDA_GRAPH_CAPTURABLE, BehaviorNote.RUNTIME_COMPILATION, BehaviorNote.DEVICE_SCALARS}
    return frozenset(numerical), frozenset(behavior)


def _runtime_fused_epilogue(piece: Piece, conv: Node) -> bool:
    """Whether the epilogue after `conv` (pointwise nodes reading its result, directly or through other
    pointwise nodes) sends cuDNN to its runtime-fusion plans, measured slower than the generated kernel
    (bench/results/constants.md#cudnn-leads):
    a residual add (a tensor from outside the piece with the conv output's full shape) or a per-channel
    scale (a multiply by a broadcast tensor from outside: an inference batchnorm left unfolded, as
    `from_torch` imports it); not a bias and an activation (cuDNN's fused conv kernels). A prologue on
    the conv's input (SBR) is not an epilogue."""
    out = conv.output_uids()[0]
    shape = list(piece.tensor(out).dim)
    after = {out}
    for node in piece.nodes:  # (in topological order)
        if node.kind != "pointwise" or not after & set(node.input_uids()):
            continue
        outside = [u for u in node.input_uids() if u in piece.inputs]
        if any(list(piece.tensor(u).dim) == shape for u in outside):
            return True  # a residual add
        if getattr(node.op, "mode", None) is PointwiseMode.MUL and any(piece.tensor(u).numel > 1 for u in outside):
            return True  # a per-channel scale (a scalar factor: not measured, the general rule decides)
        after |= set(node.output_uids())
    return False


class CudnnKernel(Kernel):
    """One cuDNN execution plan, built (or deserialized from the disk cache or a plan file:
    cudnn_launch.py); `bind` prebuilds its variant pack, `run` binds the piece's buffers by UID."""

    needs_torch_stream = False  # launches on the binding's raw stream, set on the handle

    def __init__(self, piece: Piece, config: EngineConfig, device: Device) -> None:
        super().__init__(piece, config)
        self.device = device
        heuristic, index, name = config.knob("heuristic"), config.knob("plan"), config.knob("name")
        if heuristic not in ("A", "FALLBACK") or not isinstance(index, int):
            raise AttributeValueError(
                f"cudnn config {config} has no valid 'heuristic' (A or FALLBACK) and 'plan' (int) knobs",
                op=piece.nodes[0].label(),
                rule="cudnn.config",
                hint="take cudnn configs from engine_configs() or from a plan the engine built",
            )
        self.handle = _handle(device.index)
        self.padded = padded(piece)  # one plan for every shape of the piece's bucket (cudnn_padded)
        signature = plan_signature(piece, self.padded)
        self.key = cudnn_launch.plan_key(signature, [list(k) for k in config.knobs], device.index)
        self.serialized: bytes | None = None
        self.graph: Any = None
        self.index = index
        self.cpp_index = -1  # the backend's position of the plan; -1: the graph's built plan
        self.deserialized = False  # built here (False) or loaded from the cache or a plan file
        data = cudnn_launch.stored(self.key)
        if data is not None:
            try:
                self.graph = cudnn_launch.deserialize(self.handle, data)
                self.scratch_bytes = int(self.graph.get_workspace_size())
                self.serialized = data
                self.deserialized = True
            except Exception as err:  # noqa: BLE001 - another cuDNN's plan, or a damaged file: build it
                log.info("%s: the stored cuDNN plan does not load (%s); building it", piece.label(), err)
                self.graph = None
        if self.graph is None:
            self._build(piece, heuristic, index, name)
        import torch

        self._torch_device = torch.device(device.torch_name)
        problem = self._bind_piece(piece)
        if problem is not None:
            raise Declined(f"the bucket's padded cuDNN plan does not run this shape: {problem}")

    def _bind_piece(self, piece: Piece) -> str | None:
        """What the kernel binds of `piece` (its shape's operands, views and, in the padded form, its
        lengths and ragged offsets in a device buffer of its own); why not, where the padded plan cannot
        run the piece's shape."""
        import torch

        self.piece = piece
        keys, views = operand_slots(piece)
        self.uids = tuple(keys)
        self.canon = canonical_uids(piece, keys)  # piece UID -> the cuDNN graph's
        # where each bound UID's memory starts: (the buffer's UID, a byte offset); views' in their base
        self.where = {u: (u, 0) for u in keys}
        for u, v in views.items():
            self.where[u] = (v.base, v.offset * piece.tensor(v.base).data_type.itemsize)
        self.views = views
        self.slots_in: dict[int, list[int]] = {}  # buffer UID -> the bound UIDs lying in it (rebind)
        for u, (base, _) in self.where.items():
            self.slots_in.setdefault(base, []).append(u)
        # one host float per pass-by-value scalar (cuDNN copies it at launch)
        self.host_scalars = {
            u: torch.zeros(1, dtype=torch.float32) for u in self.uids if piece.tensor(u).is_pass_by_value
        }
        self.extras: dict[int, Any] = {}  # the padded form's stand-in UIDs -> their int32 device tensors
        if self.padded is None:
            return None
        if len(keys) != self.padded.slots or frozenset(views) != self.padded.viewed:
            return "its operands bind otherwise at this shape than the bucket's plan binds them"
        values = lengths(self.padded, piece, views)
        if isinstance(values, str):
            return values
        if torch.cuda.is_current_stream_capturing():
            raise ExecutionError(
                "a new shape's padded cuDNN attention writes its lengths to the device when the shape's plan is "
                "made, which a CUDA graph capture cannot hold",
                op=piece.nodes[-1].label(),
                rule="cudnn.padded_capture",
                hint="execute the plan once at this shape (or call plan.at(shape)) before capturing it",
            )
        # (a blocking copy when the shape's plan is made, at its first execute: it waits for the current
        # stream's queued work once per new shape, never at a later execute)
        held = torch.tensor(values, dtype=torch.int32, device=self._torch_device)
        self.canon.update(canonical_extras(len(keys)))
        for name, (start, count) in sections(self.padded.batch).items():
            self.extras[EXTRA_UIDS[name]] = held[start : start + count]
        return None

    def detail(self) -> str | None:
        if self.padded is None:
            return None
        q = self.padded.layouts[0]
        return f"cuDNN's padded form: one plan for the bucket, built at batch {q.dim[0]} x {q.dim[2]} rows"

    def at_shape(self, piece: Piece) -> CudnnKernel | None:
        """This padded kernel (its plan built once for the bucket) for the bucket's piece at another
        shape, re-pointed: nothing planned or built; None where its plan cannot run that shape."""
        shaped = copy.copy(self)
        if shaped._bind_piece(piece) is not None:
            return None
        shaped.repointed = True
        return shaped

    def _build(self, piece: Piece, heuristic: str, index: int, name: Any) -> None:
        try:
            self.lowered, names = _plans(piece, self.device, heuristic, self.padded)
            if name is not None and (index >= len(names) or names[index] != name):
                if name not in names:
                    raise Declined(f"cuDNN no longer offers plan {name!r} (this cuDNN offers {len(names)} plans)")
                index = names.index(name)
            self.graph = self.lowered.graph
            self.graph.build_plan_at_index(index)
            self.index = index
            self.scratch_bytes = int(self.graph.get_workspace_size_plan_at_index(index))
            launch = _backend_launcher(self.graph, index)
            self.cpp_index = launch[1] if launch is not None else -1
        except (Declined, AttributeValueError):
            raise
        except Exception as err:  # noqa: BLE001 - cuDNN's own exception types vary by version
            raise ExecutionError(
                f"cuDNN could not build plan {index} ({name}): {type(err).__name__}: {err}",
                op=piece.nodes[0].label(),
                rule="cudnn.build",
                hint="pick another cudnn plan (engine_configs(heur_mode='B')) or another engine",
            ) from err
        self.serialized = cudnn_launch.serialize(self.graph)
        if self.serialized is not None:
            cudnn_launch.store(self.key, self.serialized)

    def bind(self, binding: Any, scratch: Any) -> Any:
        return cudnn_launch.CudnnLauncher(self, binding, scratch)

    def artifacts(self) -> list[Any]:
        if self.serialized is None:
            return []
        return [artifacts.Artifact(cudnn_launch.ARTIFACT_KIND, self.key, self.serialized)]

    def run(self, buffers: Mapping[int, Buffer], stream: Stream = None, scratch: Buffer = None) -> None:
        """One self-contained run. `stream`: a raw cudaStream_t (None: PyTorch's current stream)."""
        import torch

        dev = self._torch_device
        pack: UidPack = {}
        for uid in self.uids:
            base = self.where[uid][0]
            value = buffers[base]
            if uid in self.host_scalars:
                self.host_scalars[uid].fill_(float(value))
                value = self.host_scalars[uid]
            elif not isinstance(value, torch.Tensor):
                value = as_torch(value, self.piece.tensor(base), dev)
            if uid in self.views:  # its elements inside the base buffer
                view = self.views[uid]
                value = value.as_strided(view.desc.dim, view.desc.stride, value.storage_offset() + view.offset)
            pack[uid] = value
        raw = stream if stream is not None else torch.cuda.current_stream(dev).cuda_stream
        cudnn_launch._set_stream(self.handle, _Slot(int(raw)))
        workspace = scratch if self.scratch_bytes else None
        lowered = cudnn_launch.lowered_of(self.graph)
        pack.update(self.extras)
        ptrs = {self.canon[u]: t.data_ptr() for u, t in pack.items()}
        ws = workspace.data_ptr() if workspace is not None else 0
        try:
            if self.cpp_index >= 0 and hasattr(lowered, "_execute_plan_at_index"):
                lowered._execute_plan_at_index(ptrs, ws, self.cpp_index, self.handle.backend_handle, None, None, None)
            elif self.cpp_index < 0 and hasattr(lowered, "_execute"):
                lowered._execute(ptrs, ws, self.handle.backend_handle, None, None, None)
            else:
                self.graph.execute_plan_at_index(
                    {self.canon[u]: t for u, t in pack.items()}, workspace, index=self.index, handle=self.handle
                )
        except Exception as err:  # noqa: BLE001
            raise ExecutionError(
                f"cuDNN failed to execute: {type(err).__name__}: {err}",
                op=self.piece.nodes[0].label(),
                rule="cudnn.execute",
                hint="build without the 'cudnn' engine (deselect_engines=['cudnn'])",
            ) from err

    def lowered_is_deserialized(self) -> bool:
        return self.deserialized


class _Slot:
    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle


class CudnnEngine(Engine):
    name = "cudnn"
    fuses_neighbours = True

    def available(self, device: Device) -> Support:
        if not device.is_cuda:
            return Support.no("cuDNN runs on CUDA devices only")
        problem = _import_problem()
        return Support.no(problem) if problem else Support.yes()

    def supports(self, piece: Piece, device: Device) -> Support:
        avail = self.available(device)
        if not avail.ok:
            return avail
        static = static_problem(piece)
        if static is not None:
            return Support.no(*static)
        why, _ = _verdict(piece, device)
        return Support.no(why) if why else Support.yes()

    def facts(self, piece: Piece, device: Device) -> EngineFacts:
        """The cost model's estimate (cuDNN's fused kernels run near the device's rates), whether a
        forward conv's epilogue sends cuDNN to its runtime-fusion plans (`_runtime_fused_epilogue`), and
        whether one plan serves every shape of the piece's bucket (the padded attention form)."""
        conv = next((n for n in piece.nodes if n.kind in CONV_KINDS), None)
        facts = set()
        if conv is not None and conv.kind == "conv_fprop" and _runtime_fused_epilogue(piece, conv):
            facts.add(PieceFact.RUNTIME_FUSED_EPILOGUE)
        if padded(piece) is not None:
            facts.add(PieceFact.ONE_PLAN_PER_BUCKET)
        return EngineFacts(estimate_us(piece, device), frozenset(facts))

    def kernel_at(self, kernel: Kernel, piece: Piece, device: Device) -> Kernel | None:
        """A padded kernel re-pointed at the shape (its bucket's one plan, cudnn_padded); any other
        built again at the shape (the default)."""
        if isinstance(kernel, CudnnKernel) and kernel.padded is not None:
            return kernel.at_shape(piece)
        return super().kernel_at(kernel, piece, device)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        why, names = _verdict(piece, device)
        if why or mode is HeurMode.FALLBACK:
            return []
        count = B_PLANS if mode is HeurMode.B else 1
        numerical, behavior = _notes(piece)
        return [
            EngineConfig(
                "cudnn",
                (("heuristic", "A"), ("plan", i), ("name", name)),
                numerical_notes=numerical,
                behavior_notes=behavior,
                estimate_us=estimate_us(piece, device),
                why=f"cuDNN's plan {i} for heur_mode.A ({mode.name} heuristic)",
            )
            for i, name in enumerate(names[:count])
        ]

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        try:
            return CudnnKernel(piece, config, device)
        except Declined as err:
            raise ExecutionError(
                str(err),
                op=piece.nodes[0].label(),
                rule="cudnn.build",
                hint="build again to let the heuristics pick a plan this cuDNN offers",
            ) from err


register_engine(CudnnEngine())
__all__ = ["CudnnEngine", "CudnnKernel", "static_problem"]
