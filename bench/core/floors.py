"""Floors: the least time a workload could take on the machine, from what it must move and compute.

- bytes: each input read once and each output written once, at the copy bandwidth measured at the
  start of the run (bytes read + written per second by a device-to-device copy);
- math: the workload's floating-point operations at the cuBLAS GEMM rate measured for its type
  (8192^3), the datasheet's dense peak printed beside it;
- named alternatives (`alt_bytes`), e.g. batchnorm's two-pass bound (statistics, then normalize:
  the input read twice) when its input does not fit in L2;
- networks: a per-layer roofline, the sum over layers of max(layer flops / GEMM rate, layer bytes /
  bandwidth), where each layer reads its input once, writes its output once and reads its weights once
  (`roofline_layers` turns layer records into these terms).

Units: bytes, flops, GB/s (1e9 B/s), TFLOP/s; times in microseconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

# Dense (no sparsity) tensor-core peaks and memory bandwidth from NVIDIA's datasheets, by the name
# torch.cuda.get_device_name() reports; the first matching key wins (more specific names first).
DATASHEET: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"float16": 835.0, "bfloat16": 835.0, "hbm_gbps": 4800.0}),
    ("H200", {"float16": 989.4, "bfloat16": 989.4, "float8_e4m3fn": 1978.9, "hbm_gbps": 4800.0}),
    ("H100 NVL", {"float16": 835.0, "bfloat16": 835.0, "hbm_gbps": 3900.0}),
    ("H100 PCIe", {"float16": 756.0, "bfloat16": 756.0, "hbm_gbps": 2000.0}),
    ("H100", {"float16": 989.4, "bfloat16": 989.4, "float8_e4m3fn": 1978.9, "hbm_gbps": 3350.0}),  # SXM5 80GB HBM3
    ("A100", {"float16": 312.0, "bfloat16": 312.0, "hbm_gbps": 2039.0}),
)


def datasheet(device_name: str) -> dict[str, float] | None:
    for key, values in DATASHEET:
        if key.lower() in device_name.lower():
            return dict(values)
    return None


@dataclass(frozen=True)
class Ceilings:
    """Rates measured on the machine at the start of a run."""

    copy_gbps: float  # a device copy: bytes read + written per second
    gemm_tflops: Mapping[str, float]  # by dtype name: float16, bfloat16
    read_gbps: float | None = None  # a streaming reduction: bytes read per second (None in older records)

    @property
    def hbm_gbps(self) -> float:
        """The memory rate floors use: the faster of the two measured (a read-mostly workload, such as
        decode attention, streams faster than a copy's mix of reads and writes: a floor must not be
        above what a kernel can do)."""
        return max(self.copy_gbps, self.read_gbps or 0.0)

    def rate(self, dtype: str) -> float | None:
        return self.gemm_tflops.get(dtype) or self.gemm_tflops.get("float16")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"copy_gbps": self.copy_gbps, "gemm_tflops": dict(self.gemm_tflops)}
        return d if self.read_gbps is None else {**d, "read_gbps": self.read_gbps}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ceilings:
        read = d.get("read_gbps")
        return cls(
            float(d["copy_gbps"]),
            {k: float(v) for k, v in d["gemm_tflops"].items()},
            None if read is None else float(read),
        )


@dataclass(frozen=True)
class Layer:
    """One term of a per-layer roofline."""

    name: str
    flops: float
    bytes: float


@dataclass(frozen=True)
class Floor:
    bytes: float = 0.0
    flops: float = 0.0
    dtype: str = "float16"
    alt_bytes: tuple[tuple[str, float], ...] = ()
    layers: tuple[Layer, ...] = ()
    note: str = ""
    tflops: bool = False  # also a TFLOP/s table: the flops (or the layers' sum) over each CUDA-graph device time

    @property
    def total_flops(self) -> float:
        """The workload's floating-point operations: stated, else the layers' sum."""
        return self.flops or sum(x.flops for x in self.layers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["alt_bytes"] = [list(a) for a in self.alt_bytes]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Floor:
        if not d:
            return cls()
        return cls(
            float(d.get("bytes", 0.0)),
            float(d.get("flops", 0.0)),
            d.get("dtype", "float16"),
            tuple((str(n), float(b)) for n, b in d.get("alt_bytes", ())),
            tuple(Layer(**layer) for layer in d.get("layers", ())),
            d.get("note", ""),
            bool(d.get("tflops", False)),
        )


def bytes_us(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e3) if nbytes and gbps else 0.0


def math_us(flops: float, tflops: float | None) -> float:
    return flops / (tflops * 1e6) if flops and tflops else 0.0


def roofline_us(layers: Sequence[Layer], gbps: float, tflops: float) -> float:
    return sum(max(math_us(x.flops, tflops), bytes_us(x.bytes, gbps)) for x in layers)


@dataclass(frozen=True)
class FloorTimes:
    """A floor evaluated on a machine's ceilings."""

    us: float  # the floor (0.0: none stated)
    kind: str  # "bytes", "math", "per-layer roofline" or ""
    terms: dict[str, float] = field(default_factory=dict)  # every bound computed, by label

    def text(self) -> str:
        if not self.us:
            return "—"
        extra = [f"{k} {v:.1f}" for k, v in self.terms.items() if k.startswith("bytes (") and v]
        return f"{self.us:.1f} ({self.kind})" + (f"; {', '.join(extra)}" if extra else "")


def evaluate(floor: Floor, ceilings: Ceilings) -> FloorTimes:
    rate = ceilings.rate(floor.dtype)
    terms = {"bytes": bytes_us(floor.bytes, ceilings.hbm_gbps), "math": math_us(floor.flops, rate)}
    for label, nbytes in floor.alt_bytes:
        terms[f"bytes ({label})"] = bytes_us(nbytes, ceilings.hbm_gbps)
    if floor.layers:
        terms["per-layer roofline"] = roofline_us(floor.layers, ceilings.hbm_gbps, rate or 0.0)
        terms["math"] = math_us(floor.total_flops, rate)
        terms["bytes"] = bytes_us(sum(x.bytes for x in floor.layers), ceilings.hbm_gbps)
        return FloorTimes(terms["per-layer roofline"], "per-layer roofline", terms)
    if not terms["bytes"] and not terms["math"]:
        return FloorTimes(0.0, "", terms)
    kind = "bytes" if terms["bytes"] >= terms["math"] else "math"
    return FloorTimes(terms[kind], kind, terms)


# -- per-layer rooflines of networks -------------------------------------------------------------------
@dataclass(frozen=True)
class LayerRecord:
    """What a network layer reads, writes and computes (collected by forward hooks on the module).

    kind: "gemm" (conv, linear), "pool", "norm", "act" (activations and other elementwise modules),
    or "add" (a residual join: `in_bytes` is the second operand read once more)."""

    kind: str
    name: str
    flops: float = 0.0
    in_bytes: float = 0.0
    out_bytes: float = 0.0
    weight_bytes: float = 0.0
    first: bool = False  # reads the network's input (no input gradient in training)


def roofline_layers(records: Sequence[LayerRecord], *, training: bool = False) -> tuple[Layer, ...]:
    """The roofline terms of a network.

    Inference: a conv/linear/pooling layer reads its input once, writes its output once and reads its
    weights once; normalizations and activations are folded or fused into the layer before them (no
    traffic of their own); a residual add reads its second operand once more.
    Training: each conv/linear layer is three terms of its forward flops each, forward (input, weights,
    output), data gradient (output gradient, weights, input gradient; none for the first layer) and
    weight gradient (input, output gradient, weight gradient); normalizations read and write their
    tensor forward and read two, write one backward (statistics need the whole batch, so they do not
    fuse); pooling reads and writes forward and backward; SGD with momentum reads weights, velocity
    and gradient and writes weights and velocity."""
    out: list[Layer] = []
    for r in records:
        if r.kind == "gemm":
            out.append(Layer(r.name, r.flops, r.in_bytes + r.out_bytes + r.weight_bytes))
            if training:
                if not r.first:
                    out.append(Layer(r.name + ".dgrad", r.flops, r.out_bytes + r.weight_bytes + r.in_bytes))
                out.append(Layer(r.name + ".wgrad", r.flops, r.in_bytes + r.out_bytes + r.weight_bytes))
                out.append(Layer(r.name + ".sgd", 0.0, 5 * r.weight_bytes))
        elif r.kind == "pool":
            out.append(Layer(r.name, r.flops, r.in_bytes + r.out_bytes))
            if training:
                out.append(Layer(r.name + ".bwd", 0.0, r.in_bytes + r.out_bytes))
        elif r.kind == "add":
            out.append(Layer(r.name, 0.0, r.in_bytes))
        elif r.kind == "norm" and training:
            out.append(Layer(r.name, 0.0, r.in_bytes + r.out_bytes))
            out.append(Layer(r.name + ".bwd", 0.0, 2 * r.in_bytes + r.out_bytes))
            out.append(Layer(r.name + ".sgd", 0.0, 5 * r.weight_bytes))
    return tuple(out)
