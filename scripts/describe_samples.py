"""Print describe() for the sample conv+bias+relu and batchnorm+relu graphs at ResNet sizes and draw
their plans (docs/explain.md shows the output). Runs on the best device here."""

import sys
from pathlib import Path

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from opgraph.tools.draw import plan_to_dot, render_svg  # noqa: E402
from opgraph.tools.samples import batchnorm_relu, conv_bias_relu  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")
out.mkdir(parents=True, exist_ok=True)
for g in (conv_bias_relu(n=32, c=64, k=64, hw=56), batchnorm_relu(n=32, c=256, hw=56)):
    plan = g.build()
    print(f"$ plan.describe()  # {g.name}\n{plan.describe()}\n")
    (out / f"{g.name}.dot").write_text(plan_to_dot(plan))
    try:
        (out / f"{g.name}.svg").write_bytes(render_svg(plan_to_dot(plan)))
    except Exception as err:  # noqa: BLE001 - Graphviz may be missing where this runs
        print(f"(no SVG: {err})")
