"""Pictures of plans: the graph with each piece drawn as a coloured cluster labelled with its step,
engine and knobs (Graphviz DOT; SVG through the `graphviz` package and the `dot` program)."""

from __future__ import annotations

from typing import Any

NL = "\\n"  # a line break inside a DOT label
PALETTE = ["#cfe8fc", "#d5f5d0", "#fde2c8", "#e8d8f8", "#fbd3dc", "#fff2b3", "#d0f0f0", "#e6e6e6"]


def _q(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def plan_to_dot(plan: Any) -> str:
    g = plan.graph
    lines = [f"digraph {_q(g.name or 'graph')} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9, color="#555555"];']
    for uid, t in g.tensors.items():
        if t.is_virtual:
            continue
        shape = "ellipse" if uid in g.inputs else "doubleoctagon"
        text = f"{t.name} %{uid}" + NL + t.type_str()
        lines.append(f"  t{uid} [shape={shape}, label={_q(text)}];")
    for step in plan.steps:
        color = PALETTE[step.index % len(PALETTE)]
        knobs = " ".join(f"{k}={v}" for k, v in step.config.knobs)
        label = f"step {step.index}: {step.config.engine}" + (NL + knobs if knobs else "")
        lines += [f"  subgraph cluster_{step.index} {{", f"    label={_q(label)}; style=filled; color={_q(color)};"]
        for i, n in enumerate(step.piece.nodes):
            attrs = getattr(n.op, "mode", None)
            text = n.kind + (NL + attrs.name if attrs is not None else "") + NL + f"'{n.name}'"
            lines.append(f"    n{step.index}_{i} [shape=box, style=\"rounded,filled\", fillcolor=white, "
                         f"label={_q(text)}];")
        lines.append("  }")
    producer = {}
    for step in plan.steps:
        for i, n in enumerate(step.piece.nodes):
            for u in n.output_uids():
                producer[u] = f"n{step.index}_{i}"
    for step in plan.steps:
        for i, n in enumerate(step.piece.nodes):
            me = f"n{step.index}_{i}"
            for u in n.input_uids():
                t = g.tensors[u]
                src = producer.get(u) if (t.is_virtual or u not in g.inputs) else f"t{u}"
                if src is None:
                    src = f"t{u}"
                style = ', style=bold, color="#c0392b"' if u in plan.workspace_layout else ""
                lines.append(f"  {src} -> {me} [label={_q(f'%{u}')}{style}];")
            for u in n.output_uids():
                if not g.tensors[u].is_virtual:
                    lines.append(f"  {me} -> t{u};")
    lines.append("}")
    return "\n".join(lines)


def render_svg(dot: str) -> bytes:
    """SVG bytes of a DOT description (needs `pip install graphviz` and Graphviz's `dot` program)."""
    import graphviz

    return graphviz.Source(dot).pipe(format="svg")
