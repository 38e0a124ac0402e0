"""The `opgraph` command: demo, check, run, engines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from ..core.errors import GraphError
from ..graph.builder import Graph

console = Console()


def _fail(err: GraphError) -> None:
    console.print(f"[bold red]{type(err).__name__}[/]: {err}", highlight=False)
    sys.exit(1)


def _load(path: str) -> Graph:
    try:
        return Graph.from_json(Path(path).read_text())
    except GraphError as err:
        _fail(err)
        raise  # unreachable


def run_and_verify(g: Graph, *, device: str | None, engines: list[str] | None, seed: int, repeat: int) -> dict:
    """Build g, run it on random inputs, compare every output with the reference engine, time it."""
    from ..core.timing import time_call
    from ..testing import compare, random_pack, reference_outputs

    final = g.final
    rng = np.random.default_rng(seed)
    with console.status(f"building '{final.name}'..."):
        plan = g.build(device=device, engines=engines)
    pack = random_pack(final, rng)
    want = reference_outputs(final, pack)
    if plan.device.is_cuda:
        from ..core.torch_interop import pack_to_device, torch_to_numpy

        dev_pack = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev_pack)
        got = {u: torch_to_numpy(dev_pack[u]) for u in final.outputs}
        run = lambda: plan.execute(dev_pack)  # noqa: E731
    else:
        plan.execute(pack)
        got = {u: pack[u] for u in final.outputs}
        run = lambda: plan.execute(pack)  # noqa: E731
    mismatches = [m for u in final.outputs if (m := compare(final.tensors[u], got[u], want[u]))]
    with console.status(f"timing '{final.name}' ({repeat} runs)..."):
        micros = time_call(run, cuda=plan.device.is_cuda, warmup=min(3, repeat), repeat=repeat)
    return {"plan": plan, "mismatches": mismatches, "us": micros}


def _report(g: Graph, result: dict, *, show: bool = True) -> bool:
    if show:
        console.rule(f"graph '{g.name}'")
        console.print(str(g.final), highlight=False, soft_wrap=True)
        console.print(result["plan"].describe(), highlight=False, soft_wrap=True)
    ok = not result["mismatches"]
    for m in result["mismatches"]:
        console.print(f"[red]mismatch[/] {m}", highlight=False)
    status = "[green]matches the reference[/]" if ok else "[red]DOES NOT match the reference[/]"
    console.print(f"'{g.name}': {status}; {result['us']:.1f} µs per execute on {result['plan'].device}")
    return ok


@click.group()
@click.version_option(package_name="opgraph")
def main() -> None:
    """opgraph: operation graphs for deep-learning primitives, with a reference engine for every op."""


@main.command()
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
@click.option("--seed", default=0, show_default=True)
@click.option("--repeat", default=5, show_default=True, help="timed runs per graph")
def demo(device: str | None, seed: int, repeat: int) -> None:
    """Build conv+bias+relu and batchnorm-training+relu, run them, check them, time them."""
    from ..core.device import resolve_device
    from .samples import batchnorm_relu, conv_bias_relu

    dev = resolve_device(device)
    big = dev.is_cuda
    graphs = [
        conv_bias_relu(n=32 if big else 2, c=64 if big else 8, k=64 if big else 8, hw=56 if big else 12),
        batchnorm_relu(n=32 if big else 2, c=256 if big else 8, hw=56 if big else 12),
    ]
    table = Table(title=f"opgraph demo on {dev}")
    for col in ("graph", "steps", "engines", "matches reference", "µs / execute"):
        table.add_column(col)
    all_ok = True
    for g in graphs:
        try:
            result = run_and_verify(g, device=str(dev.kind), engines=None, seed=seed, repeat=repeat)
        except GraphError as err:
            _fail(err)
        ok = _report(g, result)
        all_ok &= ok
        plan = result["plan"]
        table.add_row(g.name, str(len(plan.steps)), ", ".join(s.config.engine for s in plan.steps),
                      "yes" if ok else "NO", f"{result['us']:.1f}")
    console.print(table)
    sys.exit(0 if all_ok else 1)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
def check(file: str) -> None:
    """Validate a graph file and explain any error."""
    g = _load(file)
    console.print(str(g.final), highlight=False, soft_wrap=True)
    console.print(f"[green]valid[/]: {len(g.final.nodes)} ops, key {g.key()[:16]}")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
@click.option("--engine", "engines", multiple=True, help="allowed engine (repeatable)")
@click.option("--seed", default=0, show_default=True)
@click.option("--repeat", default=5, show_default=True)
def run(file: str, device: str | None, engines: tuple[str, ...], seed: int, repeat: int) -> None:
    """Run a graph file on random inputs and verify it against the reference engine."""
    g = _load(file)
    try:
        result = run_and_verify(g, device=device, engines=list(engines) or None, seed=seed, repeat=repeat)
    except GraphError as err:
        _fail(err)
    sys.exit(0 if _report(g, result) else 1)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
@click.option("--engine", "engines", multiple=True, help="allowed engine (repeatable)")
@click.option("--autotune", is_flag=True, help="time the candidates (cached on disk)")
@click.option("--dot", "dot_path", type=click.Path(dir_okay=False), help="write the plan as Graphviz DOT")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False), help="draw the plan as SVG (needs Graphviz)")
def explain(file: str, device: str | None, engines: tuple[str, ...], autotune: bool, dot_path: str | None,
            svg_path: str | None) -> None:
    """Build a graph file and explain the plan: pieces, engines, knobs, estimates, why ops were not fused."""
    from .draw import plan_to_dot, render_svg

    g = _load(file)
    try:
        with console.status("building..."):
            plan = g.build(device=device, engines=list(engines) or None, autotune=autotune)
    except GraphError as err:
        _fail(err)
    console.print(plan.describe(), highlight=False, soft_wrap=True)
    dot = plan_to_dot(plan)
    if dot_path:
        Path(dot_path).write_text(dot)
        console.print(f"wrote {dot_path}")
    if svg_path:
        try:
            Path(svg_path).write_bytes(render_svg(dot))
        except Exception as err:  # noqa: BLE001 - Graphviz missing is a user-environment problem
            console.print(f"[red]could not draw SVG[/]: {err} (pip install graphviz; apt install graphviz)")
            sys.exit(1)
        console.print(f"wrote {svg_path}")


@main.command()
@click.option("--device", default=None)
def engines(device: str | None) -> None:
    """List the engines and whether each can run here."""
    from ..core.device import resolve_device
    from ..engines import engine_names, get_engine

    dev = resolve_device(device)
    table = Table(title=f"engines on {dev}")
    table.add_column("engine")
    table.add_column("available")
    for name in engine_names():
        verdict: Any = get_engine(name).available(dev)
        table.add_row(name, "yes" if verdict.ok else f"no: {verdict.reason}")
    console.print(table)


if __name__ == "__main__":
    main()
