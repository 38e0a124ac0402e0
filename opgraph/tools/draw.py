"""Pictures of plans: the graph with each piece drawn as a coloured cluster labelled with its step,
engine and knobs (Graphviz DOT; SVG through the `graphviz` package and the `dot` program).

Text is kept off the edges' paths: a step's label is a node of its own inside the cluster (Graphviz
routes edges around nodes, not around cluster titles), edges from buffers carry no label (the
buffer's node names it), and the intermediate tensors' UIDs are external labels placed where they
overlap nothing. A legend explains the shapes and the red edges.
"""

from __future__ import annotations

from typing import Any

NL = "\\n"  # a line break inside a DOT label
LEFT = "\\l"  # a left-justified line break
PALETTE = ["#cfe8fc", "#d5f5d0", "#fde2c8", "#e8d8f8", "#fbd3dc", "#fff2b3", "#d0f0f0", "#e6e6e6"]
WORKSPACE = "#c0392b"
KNOBS_PER_LINE = 4


def _q(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def _step_label(step: Any) -> str:
    knobs = [f"{k}={v}" for k, v in step.config.knobs]
    lines = [f"step {step.index}: {step.config.engine}"]
    lines += [" ".join(knobs[i : i + KNOBS_PER_LINE]) for i in range(0, len(knobs), KNOBS_PER_LINE)]
    return "".join(line + LEFT for line in lines)


def _legend() -> list[str]:
    return [
        "  subgraph cluster_legend {",
        '    label="legend"; fontname="Helvetica"; fontsize=9; style=dashed; color="#999999";',
        '    lg_in [shape=ellipse, label="input buffer", fontsize=8];',
        '    lg_op [shape=box, style="rounded", label="op", fontsize=8];',
        '    lg_out [shape=doubleoctagon, label="output buffer", fontsize=8];',
        "    lg_a [shape=point, width=0.05]; lg_b [shape=point, width=0.05];",
        "    lg_c [shape=point, width=0.05]; lg_d [shape=point, width=0.05];",
        "    lg_in -> lg_op -> lg_out;",
        f'    lg_a -> lg_b [style=bold, color="{WORKSPACE}", '
        'label=" tensor passed between kernels\\lthrough the plan\'s workspace\\l", fontsize=8];',
        '    lg_c -> lg_d [label=" a buffer of the variant pack,\\lor a tensor inside one kernel\\l", fontsize=8];',
        '    lg_key [shape=plaintext, fontsize=8, label="a coloured box is one step (one kernel\\lor '
        'engine call); %N is a tensor UID\\l"];',
        "  }",
    ]


def plan_to_dot(plan: Any, *, legend: bool = True) -> str:
    g = plan.graph
    lines = [
        f"digraph {_q(g.name or 'graph')} {{",
        "  rankdir=TB; forcelabels=true; nodesep=0.4; ranksep=0.45;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555", fontcolor="#333333"];',
    ]
    for uid, t in g.tensors.items():
        if t.is_virtual:
            continue
        shape = "ellipse" if uid in g.inputs else "doubleoctagon"
        text = f"{t.name} %{uid}" + NL + t.type_str()
        lines.append(f"  t{uid} [shape={shape}, label={_q(text)}];")
    for step in plan.steps:
        color = PALETTE[step.index % len(PALETTE)]
        lines += [
            f"  subgraph cluster_{step.index} {{",
            f'    style=filled; color={_q(color)}; label="";',
            f"    s{step.index} [shape=plaintext, fontsize=9, label={_q(_step_label(step))}];",
        ]
        for i, n in enumerate(step.piece.nodes):
            attrs = getattr(n.op, "mode", None)
            text = n.kind + (NL + attrs.name if attrs is not None else "") + NL + f"'{n.name}'"
            lines.append(
                f'    n{step.index}_{i} [shape=box, style="rounded,filled", fillcolor=white, label={_q(text)}];'
            )
        if step.piece.nodes:  # the title above the first op
            lines.append(f"    s{step.index} -> n{step.index}_0 [style=invis];")
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
                src = producer.get(u) if (t.is_virtual or u not in g.inputs) else None
                if src is None:  # a buffer: its node names it
                    lines.append(f"  t{u} -> {me};")
                    continue
                style = f', style=bold, color="{WORKSPACE}"' if u in plan.workspace_layout else ""
                lines.append(f"  {src} -> {me} [xlabel={_q(f'%{u}')}{style}];")
            for u in n.output_uids():
                if not g.tensors[u].is_virtual:
                    lines.append(f"  {me} -> t{u};")
    if legend:
        lines += _legend()
    lines.append("}")
    return "\n".join(lines)


def render_svg(dot: str) -> bytes:
    """SVG bytes of a DOT description (needs `pip install graphviz` and Graphviz's `dot` program)."""
    import graphviz  # type: ignore[import-untyped]  # graphviz ships no type information

    return graphviz.Source(dot).pipe(format="svg")
