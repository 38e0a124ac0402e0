"""Plan pictures: no edge drawn through text, and a legend for the red workspace edges (issue 20)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

import opgraph as og
from opgraph.tools.draw import plan_to_dot


def _plan():
    """Three steps on the reference/torch engines with workspace tensors between them."""
    g = og.Graph("three_steps", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[8, 16], name="x")
    w = g.tensor(dim=[16, 16], name="w")
    s = g.tensor(dim=[1, 16], name="s")
    h = g.layernorm("INFERENCE", x, scale=s, bias=s, epsilon=1e-5)[0]
    g.matmul(g.relu(g.matmul(h, w)), w).set_output(True).set_name("y")
    return g.build(device="cpu", engines=["torch"], allow_partition=True)


def test_dot_labels_steps_with_nodes_and_has_a_legend():
    plan = _plan()
    dot = plan_to_dot(plan)
    assert "cluster_legend" in dot and "workspace" in dot
    for line in dot.splitlines():
        if "->" in line and line.strip().startswith("t"):  # from a buffer: its node names it
            assert "label" not in line, line
        if "->" in line and line.strip().startswith("n") and "[" in line:
            assert "xlabel=" in line and " label=" not in line, line
    assert all(f"s{st.index} [shape=plaintext" in dot for st in plan.steps)


def _bezier_points(pos: str) -> list[tuple[float, float]]:
    """Points along a Graphviz spline ('e,x,y x,y ...' control points of cubic Beziers)."""
    pts = [tuple(map(float, p.split(","))) for p in pos.split() if not p.startswith(("e,", "s,"))]
    out = []
    for i in range(0, len(pts) - 3, 3):
        p0, p1, p2, p3 = pts[i : i + 4]
        for t in np.linspace(0, 1, 16):
            a, b, c, d = (1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t**3
            out.append((a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0], a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1]))
    return out


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_no_edge_crosses_a_label_in_the_laid_out_picture():
    plan = _plan()
    laid = json.loads(
        subprocess.run(["dot", "-Tjson"], input=plan_to_dot(plan), capture_output=True, text=True, check=True).stdout
    )
    objects = laid["objects"]
    boxes = {}
    for o in objects:
        if "pos" in o and "width" in o:  # a node: centre and size in inches (pos in points)
            x, y = map(float, o["pos"].split(","))
            w, h = float(o["width"]) * 72 / 2, float(o["height"]) * 72 / 2
            boxes[o["_gvid"]] = (x - w + 2, y - h + 2, x + w - 2, y + h - 2)
        elif o.get("lp") and o.get("label"):  # a cluster's title
            x, y = map(float, o["lp"].split(","))
            w, h = float(o["lwidth"]) * 72 / 2, float(o["lheight"]) * 72 / 2
            boxes[o["_gvid"]] = (x - w, y - h, x + w, y + h)
    for e in laid.get("edges", []):
        if e.get("style") == "invis":
            continue
        ends = {e["tail"], e["head"]}
        for px, py in _bezier_points(e["pos"]):
            for gvid, (x0, y0, x1, y1) in boxes.items():
                if gvid not in ends:
                    assert not (x0 < px < x1 and y0 < py < y1), (objects[gvid].get("name"), e)
