"""cuDNN frontend's attention API on `cudnn.pygraph`: `sdpa` / `sdpa_backward` with cuDNN's exact
signatures and defaults, ragged tensors (`tensor.set_ragged_offset`), `attention_implementation`,
`sdpa_fp8` (opgraph's composite `g.sdpa_fp8`), and typed refusals of the FP8 backward and MXFP8 variants.

What the shim adapts (docs/attention.md, "cuDNN's names"):
  - exactly one of generate_stats / is_inference (its deprecated negation) must be given, as in cuDNN;
  - Stats of a row with no key kept are -inf (cuDNN since 9.14; opgraph's own default is +inf);
  - seq_len_q / seq_len_kv given without the padding mask but with a score modifier are lengths the
    modifier reads (cuDNN's flexible graphs): the op does not take them as its padding lengths;
  - a ragged tensor's offsets count elements; the op reads them as rows (ragged.py), and its buffer
    may be smaller than its padded dims;
  - a dense band with S_q > S_kv and no padding mask under a bottom-right diagonal or a left bound is
    refused as cuDNN's frontend refuses it (GRAPH_NOT_SUPPORTED);
  - an unread Stats output (`o, _ = sdpa(..., is_inference=False)`) is dropped;
  - `implementation`: AUTO lets opgraph choose; COMPOSITE prefers the cudnn engine (cuDNN's own
    composite SDPA), UNIFIED the generated kernels; either falls back to the torch engine for what it
    declines. `unfuse_fma` and `score_mod_bprop` are accepted and unused (opgraph derives the
    modifier's derivative; its softmax has no FMA knob).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ..core.errors import AttributeValueError, UnsupportedGraphError
from ..core.tensor import Tensor
from ..ops.attention import DiagonalAlignment, Sdpa, SdpaBackward
from . import ragged
from .errors import cudnnGraphNotSupportedError, translated
from .tensors import Tensor_, adopt  # noqa: F401  (re-exported)


class attention_implementation(enum.Enum):  # noqa: N801  (cuDNN's name)
    AUTO = 0
    COMPOSITE = 1
    UNIFIED = 2


# engines tried first for an attention graph on CUDA, by implementation (opgraph engine names)
IMPLEMENTATION_ENGINES = {
    attention_implementation.COMPOSITE: ("cudnn", "torch", "reference"),
    attention_implementation.UNIFIED: ("triton", "torch", "reference"),
}


# roles of the attention ops whose tensors may be ragged, and the op role of their offsets
_FWD_TENSORS = {
    "q": "q",
    "k": "k",
    "v": "v",
    "paged_attention_k_table": "paged_attention_k_table",
    "paged_attention_v_table": "paged_attention_v_table",
}
_FWD_OUTPUTS = {"o": "o", "stats": "stats", "score_max": "stats", "score_sum_exp": "stats"}
_BWD_TENSORS = {r: r for r in ("q", "k", "v", "o", "dO", "stats")}
_BWD_OUTPUTS = {r: r for r in ("dQ", "dK", "dV")}
_KV = frozenset({"k", "v", "dK", "dV"})


def _refuse(what: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise cudnnGraphNotSupportedError(
            f"{what} is not implemented by opgraph",
            op=what,
            rule="cudnn.not_implemented",
            hint="opgraph's attention takes HALF, BFLOAT16, FLOAT and DOUBLE tensors (sdpa, sdpa_backward)",
        )

    method.__name__ = what
    return method


def _one_stats_flag(generate_stats: Any, is_inference: Any, label: str) -> None:
    """cuDNN's rule: exactly one of generate_stats and its deprecated negation is_inference is given."""
    if (generate_stats is None) == (is_inference is None):
        raise AttributeValueError(
            "exactly one of generate_stats and is_inference must be set",
            op=label,
            rule="cudnn.generate_stats",
            hint="pass generate_stats=True for training (is_inference is its deprecated negation)",
        )


def _refuse_rows_without_keys(rec: Any) -> None:
    """cuDNN's refusals of dense bands with S_q > S_kv (no padding mask) under a bottom-right diagonal
    or a left bound: cuDNN raises GRAPH_NOT_SUPPORTED ("Bottom right causal mask does not support
    max_s_q > max_s_kv", "Sliding window attention is only supported with max_s_q <= max_s_kv"), so
    programs written for it slice Q or take another path; such bands leave query rows with no key,
    for which NVIDIA's tests define no result. opgraph's own `og.Graph.sdpa` runs these graphs (rows
    with no key: O 0). Paged caches are left out: cuDNN requires the padding mask with them."""
    op = rec.op
    if op.use_padding_mask:
        return
    ins = dict(zip(op.input_roles(), rec.inputs))
    if ins.get("paged_attention_k_table") is not None or ins.get("paged_attention_v_table") is not None:
        return
    q, k = ins.get("q"), ins.get("k")
    dims_q, dims_k = getattr(q, "_dim", None), getattr(k, "_dim", None)
    if not dims_q or not dims_k or len(dims_q) != 4 or len(dims_k) != 4 or dims_q[2] <= dims_k[2]:
        return
    if op.bottom_right and op.right_bound is not None:
        what, fix = (
            "a bottom-right causal band (use_causal_mask_bottom_right, or a right bound with BOTTOM_RIGHT "
            "alignment), whose first S_q - S_kv query rows see no key",
            "slice Q to its last S_kv rows (as cuDNN asks), ",
        )
    elif op.sliding_window_length is not None:
        what, fix = ("a sliding window (a left bound)", "")
    else:
        return
    raise cudnnGraphNotSupportedError(
        f"cuDNN does not support {what} with q's S_q={dims_q[2]} > k's S_kv={dims_k[2]} and no padding mask",
        op=rec.name,
        rule="cudnn.band_sq_gt_skv",
        hint=f"{fix}give seq_len_q / seq_len_kv with use_padding_mask=True, or build the graph with opgraph's "
        "own og.Graph.sdpa, which runs it as it is (rows with no key: O 0)",
    )


class AttentionGraph:
    """The attention part of `cudnn.pygraph` (a mixin over opgraph's Graph)."""

    _ragged_offsets: dict[int, Tensor]
    _ragged_layouts: dict[int, ragged.RaggedLayout]
    _implementations: set[Any]

    def _init_attention(self) -> None:
        self._ragged_offsets = {}
        self._ragged_layouts = {}
        self._implementations = set()
        self._attention_done: set[int] = set()  # id() of records already adapted
        self._pending_layouts: list[tuple[Any, ...]] = []  # (tensor, offset, role, S, row stride, output)
        self._composite_records: list[Any] = []  # the op records a composite (sdpa_fp8) added

    # -- builders -------------------------------------------------------------------------------------
    @translated
    def sdpa(
        self,
        q: Any,
        k: Any,
        v: Any,
        is_inference: Any = None,
        attn_scale: Any = None,
        bias: Any = None,
        block_mask: Any = None,
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: Any = None,
        diagonal_alignment: Any = DiagonalAlignment.TOP_LEFT,
        diagonal_band_left_bound: Any = None,
        diagonal_band_right_bound: Any = None,
        dropout: Any = None,
        rng_dump: Any = None,
        paged_attention_k_table: Any = None,
        paged_attention_v_table: Any = None,
        paged_attention_max_seq_len_kv: Any = None,
        compute_data_type: Any = None,
        name: str = "",
        score_mod: Any = None,
        generate_stats: Any = None,
        implementation: Any = attention_implementation.AUTO,
        score_max: Any = None,
        score_sum_exp: Any = None,
        sink_token: Any = None,
        unfuse_fma: bool = False,
    ) -> list[Any]:
        """cuDNN frontend's `pygraph.sdpa` (its signature and defaults; the module docstring lists what
        the shim adapts). Returns [O, Stats] (Stats None without generate_stats)."""
        _one_stats_flag(generate_stats, is_inference, f"sdpa '{name}'")
        self._implementation(implementation)
        if score_mod is not None and not use_padding_mask:
            seq_len_q = seq_len_kv = None  # lengths the modifier reads (cuDNN's flexible graphs)
        from ..ops.attention_builders import sdpa as build

        o, stats = build(
            self,
            q,
            k,
            v,
            attn_scale=attn_scale,
            generate_stats=generate_stats,
            bias=bias,
            use_alibi_mask=use_alibi_mask,
            use_padding_mask=use_padding_mask,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            use_causal_mask=use_causal_mask,
            use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length,
            dropout=dropout,
            score_mod=score_mod,
            compute_data_type=compute_data_type,
            name=name,
            is_inference=is_inference,
            diagonal_alignment=diagonal_alignment,
            diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound,
            rng_dump=rng_dump,
            paged_attention_k_table=paged_attention_k_table,
            paged_attention_v_table=paged_attention_v_table,
            paged_attention_max_seq_len_kv=paged_attention_max_seq_len_kv,
            sink_token=sink_token,
            score_max=score_max,
            score_sum_exp=score_sum_exp,
            block_mask=block_mask,
            empty_row_stats="-inf",
        )
        return [o, stats]

    @translated
    def sdpa_backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        o: Any,
        dO: Any,
        stats: Any,
        attn_scale: Any = None,
        bias: Any = None,
        dBias: Any = None,
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        max_total_seq_len_q: Any = None,
        max_total_seq_len_kv: Any = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: Any = None,
        diagonal_alignment: Any = DiagonalAlignment.TOP_LEFT,
        diagonal_band_left_bound: Any = None,
        diagonal_band_right_bound: Any = None,
        dropout: Any = None,
        rng_dump: Any = None,
        use_deterministic_algorithm: bool = False,
        compute_data_type: Any = None,
        name: str = "",
        score_mod: Any = None,
        score_mod_bprop: Any = None,
        sink_token: Any = None,
        dSink_token: Any = None,
    ) -> list[Any]:
        """cuDNN frontend's `pygraph.sdpa_backward`: [dQ, dK, dV]. max_total_seq_len_q/kv (cuDNN's
        workspace sizes for ragged tensors) are checked and unused: packed buffers are bound as they are."""
        label = f"sdpa_backward '{name}'"
        for what, value in (
            ("max_total_seq_len_q", max_total_seq_len_q),
            ("max_total_seq_len_kv", max_total_seq_len_kv),
        ):
            if value is not None and (isinstance(value, bool) or int(value) < 0):
                raise AttributeValueError(
                    f"{what}={value!r} is not a count of tokens",
                    op=label,
                    rule="cudnn.max_total_seq_len",
                    hint=f"pass {what} as an int >= 0",
                )
        if rng_dump is not None:
            raise UnsupportedGraphError(
                "sdpa_backward writes no rng_dump (the forward does)",
                op=label,
                rule="cudnn.rng_dump",
                hint="dump the dropout mask from the forward sdpa",
            )
        if score_mod is not None and not use_padding_mask:
            seq_len_q = seq_len_kv = None
        from ..ops.attention_builders import sdpa_backward as build

        return build(
            self,
            q,
            k,
            v,
            o,
            dO,
            stats,
            attn_scale=attn_scale,
            bias=bias,
            dBias=dBias,
            use_alibi_mask=use_alibi_mask,
            use_padding_mask=use_padding_mask,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            use_causal_mask=use_causal_mask,
            use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length,
            dropout=dropout,
            score_mod=score_mod,
            use_deterministic_algorithm=use_deterministic_algorithm,
            compute_data_type=compute_data_type,
            name=name,
            diagonal_alignment=diagonal_alignment,
            diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound,
            sink_token=sink_token,
            dSink_token=dSink_token,
        )

    @translated
    def sdpa_fp8(
        self,
        q: Any,
        k: Any,
        v: Any,
        descale_q: Any,
        descale_k: Any,
        descale_v: Any,
        descale_s: Any,
        scale_s: Any,
        scale_o: Any,
        is_inference: Any = None,
        attn_scale: Any = None,
        use_padding_mask: bool = False,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        dropout: Any = None,
        compute_data_type: Any = None,
        name: str = "",
        generate_stats: Any = None,
        sliding_window_length: Any = None,
        diagonal_alignment: Any = DiagonalAlignment.TOP_LEFT,
        diagonal_band_left_bound: Any = None,
        diagonal_band_right_bound: Any = None,
        implementation: Any = attention_implementation.AUTO,
        **unsupported: Any,
    ) -> list[Any]:
        """cuDNN frontend's `pygraph.sdpa_fp8` (its signature, positional order and defaults): [O, Stats,
        amax_s, amax_o] (Stats None in inference), as opgraph's `g.sdpa_fp8` composite (cuDNN's SDPAFP8Node
        written out in the graph's ops, the band masks included); an amax or Stats the program leaves virtual
        and unread is dropped with the ops computing it only for it. Padding masks, dropout and any other
        argument cuDNN's later releases add are refused by name."""
        label = f"sdpa_fp8 '{name}'"
        _one_stats_flag(generate_stats, is_inference, label)
        self._implementation(implementation)
        given = [key for key, value in unsupported.items() if value is not None and value is not False]
        given += [k for k, on in (("use_padding_mask", use_padding_mask), ("dropout", dropout is not None)) if on]
        given += [k for k, t in (("seq_len_q", seq_len_q), ("seq_len_kv", seq_len_kv)) if t is not None]
        if given:
            raise cudnnGraphNotSupportedError(
                f"sdpa_fp8's {', '.join(sorted(given))} is not implemented by opgraph (its fp8 attention takes "
                "attn_scale, the causal masks and the band, and the fp8 scales)",
                op=label,
                rule="cudnn.not_implemented",
                hint="drop it, or run the attention in 16 bits through sdpa, which takes it",
            )
        from ..ops.attention_builders import stats_flag
        from ..ops.attention_fp8 import sdpa_fp8 as build

        g: Any = self
        start = len(g._records)

        out = build(
            self,
            q,
            k,
            v,
            descale_q,
            descale_k,
            descale_v,
            descale_s,
            scale_s,
            scale_o,
            generate_stats=stats_flag(generate_stats, is_inference, label),
            attn_scale=attn_scale,
            use_causal_mask=use_causal_mask,
            use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length,
            diagonal_alignment=diagonal_alignment,
            diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound,
            compute_data_type=compute_data_type,
            name=name or f"sdpa_fp8_{start}",
        )
        self._composite_records.extend(g._records[start:])  # (the builder appends its ops)
        return out

    sdpa_fp8_backward = translated(_refuse("sdpa_fp8_backward"))
    sdpa_mxfp8 = translated(_refuse("sdpa_mxfp8"))
    sdpa_mxfp8_backward = translated(_refuse("sdpa_mxfp8_backward"))

    def _implementation(self, value: Any) -> None:
        name = getattr(value, "name", value)
        if name not in attention_implementation.__members__:
            raise AttributeValueError(
                f"implementation={value!r} is not an attention_implementation",
                rule="cudnn.attention_implementation",
                hint=f"one of {list(attention_implementation.__members__)}",
            )
        impl = attention_implementation[name]
        if impl is not attention_implementation.AUTO:
            self._implementations.add(impl)
        if len(self._implementations) > 1:
            raise AttributeValueError(
                "one graph asks for both the COMPOSITE and the UNIFIED implementation",
                rule="cudnn.attention_implementation",
                hint="build the two attention ops in graphs of their own",
            )

    def implementation_engines(self) -> tuple[str, ...] | None:
        """The engines an explicit `implementation` puts first (None: opgraph's choice)."""
        return IMPLEMENTATION_ENGINES[next(iter(self._implementations))] if self._implementations else None

    # -- validate: cuDNN's attention conventions onto opgraph's ops ----------------------------------------
    def _adapt_attention(self) -> None:
        """Attach ragged offsets (rows, op attributes) and drop unread Stats, once per op record."""
        g: Any = self
        self._drop_unread_composite_results()
        read = {id(v) for r in g._records for v in r.inputs if isinstance(v, Tensor)}
        for rec in g._records:
            if not isinstance(rec.op, (Sdpa, SdpaBackward)):
                continue
            _refuse_rows_without_keys(rec)  # (at every validate: a caught refusal is no way past it)
            if id(rec) in self._attention_done:
                continue
            self._attention_done.add(id(rec))
            if isinstance(rec.op, Sdpa):
                st = rec.outputs[1]
                if st is not None and st.is_virtual and id(st) not in read:
                    rec.outputs[1] = None
                    g._tensors = [t for t in g._tensors if t is not st]
            self._attach_ragged(rec)

    def _drop_unread_composite_results(self) -> None:
        """Remove a composite's ops whose results are all virtual and unread (an amax the program leaves
        virtual, as cuDNN's programs may), then those that only they read."""
        g: Any = self
        composite = {id(r) for r in self._composite_records}  # (the list holds them: their ids stay theirs)
        while True:
            read = {id(v) for r in g._records for v in r.inputs if isinstance(v, Tensor)}
            dead = [
                r
                for r in g._records
                if id(r) in composite and all(t is None or (t.is_virtual and id(t) not in read) for t in r.outputs)
            ]
            if not dead:
                return
            gone = {id(t) for r in dead for t in r.outputs if t is not None}
            dropped = {id(r) for r in dead}
            g._records = [r for r in g._records if id(r) not in dropped]
            g._tensors = [t for t in g._tensors if id(t) not in gone]
            g._invalidate()

    def _attach_ragged(self, rec: Any) -> None:
        op = rec.op
        forward = isinstance(op, Sdpa)
        roles = list(op.input_roles())
        ins = dict(zip(roles, rec.inputs))
        outs = dict(zip(op.output_roles(), rec.outputs))
        tensors = {
            **{r: ins.get(r) for r in (_FWD_TENSORS if forward else _BWD_TENSORS)},
            **{r: outs.get(r) for r in (_FWD_OUTPUTS if forward else _BWD_OUTPUTS)},
        }
        slots = _FWD_TENSORS | _FWD_OUTPUTS if forward else _BWD_TENSORS | _BWD_OUTPUTS
        strides: dict[str, int] = {}
        attrs: dict[str, Any] = {}
        for role, t in tensors.items():
            off = self._ragged_offsets.get(id(t)) if t is not None else None
            if t is None or off is None:
                continue
            slot = slots[role]
            rows = ragged.to_rows(t)
            if rows is None:
                raise AttributeValueError(
                    f"the ragged tensor {t.label()} has no dims and strides set",
                    op=rec.name,
                    tensor=t,
                    rule="cudnn.ragged",
                    hint="set_dim and set_stride it ([B, H, S, w] with the batch stride unused)",
                )
            given = ins.get(f"{slot}_ragged_offset")
            if given is not None and given is not off:
                raise AttributeValueError(
                    f"{t.label()} and the other '{slot}' tensors have different ragged offsets",
                    op=rec.name,
                    tensor=t,
                    rule="cudnn.ragged",
                    hint="Stats, score_max and score_sum_exp share one ragged offset",
                )
            dims, stride, s, row_stride = rows
            declared = tuple(t._dim)
            t._dim, t._stride = dims, stride
            ins[f"{slot}_ragged_offset"] = off
            strides[slot] = row_stride
            if role == "q":
                attrs["max_seq_len_q"] = s
            elif role in ("k", "v"):
                attrs["max_seq_len_kv"] = s
            self._pending_layouts.append((t, off, role, s, row_stride, role in outs, declared))
        if strides:
            rec.inputs[:] = [ins.get(r) for r in roles]
            rec.op = dataclasses.replace(op, **attrs, ragged_offset_strides=tuple(sorted(strides.items())))
            g: Any = self
            g._invalidate()

    def _layouts_after_validate(self) -> None:
        """The ragged layouts by UID (UIDs exist once the graph is validated)."""
        g: Any = self
        uid_of = g._handle_uid
        for t, off, role, s, row_stride, is_out, declared in self._pending_layouts:
            rec = next(r for r in g._records if any(t is x for x in (*r.inputs, *r.outputs)))
            ins = dict(zip(rec.op.input_roles(), rec.inputs))
            lens = None if role.startswith("paged") else ins.get("seq_len_kv" if role in _KV else "seq_len_q")
            self._ragged_layouts[uid_of[id(t)]] = ragged.RaggedLayout(
                uid_of[id(t)],
                uid_of[id(off)],
                None if lens is None else uid_of[id(lens)],
                s,
                row_stride,
                is_out,
                declared,
            )


__all__ = ["AttentionGraph", "IMPLEMENTATION_ENGINES", "Tensor_", "adopt", "attention_implementation"]
