"""Writes the files of tests/ops/test_legacy_custom_ops.py as opgraph at aee2b8b wrote them, when the
built-in pooling and slice backward and stop_gradient were custom ops. Run with that opgraph:

    git archive aee2b8b opgraph | tar -x -C /tmp/og_old
    PYTHONPATH=/tmp/og_old python tests/ops/data/make_legacy_custom_ops.py tests/ops/data
"""

import sys

import opgraph as og


def legacy_graph() -> og.Graph:
    """A training-step-like graph: max and average pooling, a strided slice and stop_gradient, differentiated."""
    from opgraph.training.losses import stop_gradient

    g = og.Graph("legacy", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    ymax = g.resample(
        x, mode="MAX", window=[3, 3], stride=[2, 2], pre_padding=[1, 1], post_padding=[1, 1], name="maxpool"
    )[0]
    yavg = g.resample(
        x,
        mode="AVG_EXCLUDE_PADDING",
        window=[2, 2],
        stride=[2, 2],
        pre_padding=[1, 0],
        post_padding=[1, 1],
        name="avgpool",
    )[0]
    part = g.slice(x, [slice(None), slice(None), slice(1, 5), slice(0, 6, 2)], name="part")
    s = g.mul(g.exp(stop_gradient(g, ymax)), ymax, name="sg_mul")
    loss = g.add(
        g.reduction(s, "add", name="r1").set_dim([1, 1, 1, 1]),
        g.add(
            g.reduction(yavg, "add", name="r2").set_dim([1, 1, 1, 1]),
            g.reduction(g.mul(part, part), "add", name="r3").set_dim([1, 1, 1, 1]),
        ),
    )
    loss.set_output(True).set_name("loss")
    bg = og.grad(g, [loss], [x], combined=True).graph
    bg.validate()
    return bg


if __name__ == "__main__":
    out = sys.argv[1]
    bg = legacy_graph()
    kinds = sorted({n.op.op_name for n in bg.final.nodes if n.kind == "custom"})
    assert kinds == ["resample_avg_backward", "resample_max_backward", "slice_backward", "stop_gradient"], kinds
    with open(f"{out}/legacy_custom_ops.graph.json", "w") as f:
        f.write(bg.to_json())
    bg.build(device="cpu", engines=["reference"]).save(f"{out}/legacy_custom_ops.reference.ogplan")
