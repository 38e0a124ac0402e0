"""The `opgraph` command (also `python -m opgraph`): demo, check, run, explain, engines, cache.

Everything it prints that comes from a graph, a plan or an error is printed as plain text (rich's
markup off), so knobs such as `triton[template=matmul BM=64]`, `[rule ...]` and
`pip install 'opgraph[torch]'` show as they are. A user's mistake (a bad file, a missing GPU, a bad
option) ends in one error and its hint, never a traceback.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core.errors import GraphError, printable
from ..core.version import __version__

console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)


def shown(text: str) -> str:
    """Text from a file or a graph, safe to print with markup: escaped for rich, and every
    character a terminal cannot show (a control character, a lone surrogate) written as repr() does."""
    return escape(printable(text, keep="\n"))


def say(text: str) -> None:
    """Print text as it is (no markup, no highlighting, no wrapping; non-printables escaped)."""
    console.print(printable(text, keep="\n"), markup=False)


def _fail(err: GraphError) -> None:
    errors.print(f"[bold red]{type(err).__name__}[/]: {shown(str(err))}")
    sys.exit(1)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command whose GraphErrors (bad files, devices, options) end in one message and exit 1. Anything
    else is opgraph's own bug: one line too (exit 2), the traceback with OPGRAPH_TRACEBACK=1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GraphError as err:
            _fail(err)
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - one line, never a traceback (unless asked for)
            import os

            if os.environ.get("OPGRAPH_TRACEBACK", "") not in ("", "0"):
                raise
            text = f"{type(err).__name__}: {err}"
            errors.print(
                f"[bold red]unexpected error[/] {shown(text[:500])} (a bug in opgraph: please report it; "
                "OPGRAPH_TRACEBACK=1 shows where)"
            )
            sys.exit(2)

    return wrapper


def _imports(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--import",
        "imports",
        multiple=True,
        metavar="MODULE",
        help="import MODULE first (a name or a .py path), e.g. one that registers custom ops; repeatable",
    )(fn)


def _device_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--device",
        default=None,
        help="cpu, cuda or cuda:N (default: the GPU when there is one; a plan file's own device)",
    )(fn)


def _file_arg(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("file", type=click.Path(exists=True, dir_okay=False))(fn)


def _load(file: str, imports: tuple[str, ...]) -> Any:
    from .cli_files import import_modules, load_file

    import_modules(imports)
    return load_file(file)


# On a machine without a GPU the reference engine alone would check itself: generated kernels (in
# Triton's interpreter) come first, then PyTorch's CPU ops, and the reference checks them all.
CPU_ENGINES = ("triton", "torch", "reference")


def _engines_for(device: Any, engines: tuple[str, ...]) -> list[str] | None:
    """The engines to build with: those asked for, else on the CPU the ones that are not the reference."""
    if engines:
        return list(engines)
    if device.is_cuda:
        return None
    from ..engines import get_engine

    return [e for e in CPU_ENGINES if get_engine(e).available(device).ok]


def _plan_of(loaded: Any, *, device: str | None, engines: tuple[str, ...], autotune: bool = False) -> Any:
    """The plan to run or explain: a plan file loaded (compiled here from its stored configs), or a
    graph file built."""
    if loaded.is_plan:
        if engines or autotune:
            raise GraphError(
                "a plan file fixes its engines and configs; --engine and --autotune apply to graph files",
                rule="cli.plan_options",
                hint="drop those options, or give the graph file",
            )
        from ..runtime.plan import load_plan

        with console.status("loading the plan..."):
            return load_plan(loaded.path, device=device, on_mismatch="recompile")
    from ..core.device import resolve_device

    dev = resolve_device(device)
    with console.status(f"building '{printable(loaded.graph.name)}'..."):
        return loaded.graph.build(device=str(dev), engines=_engines_for(dev, engines), autotune=autotune)


def _report(result: Any, *, show: bool = True) -> bool:
    plan = result.plan
    name = plan.graph.name
    if show:
        console.rule(shown(f"graph '{name}'"))
        say(str(plan.graph))
        say(plan.describe())
    for m in result.mismatches:
        console.print(f"[red]mismatch[/] {shown(str(m))}")
    ok = not result.mismatches
    status = "[green]matches the reference[/]" if ok else "[red]DOES NOT match the reference[/]"
    console.print(
        f"{escape(repr(name))}: {status} (largest |error| {result.max_err:.3g}, largest |output| "
        f"{result.scale:.3g}); {result.us:.1f} µs per execute on {escape(str(plan.device))}"
    )
    return ok


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="opgraph")
def main() -> None:
    """opgraph: operation graphs for deep-learning primitives, with a reference engine for every op.

    FILE arguments are graph files (Graph.to_json; format: docs/graph-format.md) or plan files
    (plan.save)."""


@main.command()
@_device_option
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1), help="timed runs per graph")
@user_errors
def demo(device: str | None, seed: int, repeat: int) -> None:
    """Build conv+bias+relu and batchnorm-training+relu, run them, check them, time them."""
    from ..core.device import resolve_device
    from .cli_files import run_and_verify
    from .samples import batchnorm_relu, conv_bias_relu

    dev = resolve_device(device)
    big = dev.is_cuda
    graphs = [
        conv_bias_relu(n=32 if big else 2, c=64 if big else 8, k=64 if big else 8, hw=56 if big else 12),
        batchnorm_relu(n=32 if big else 2, c=256 if big else 8, hw=56 if big else 12),
    ]
    table = Table(title=escape(f"opgraph demo on {dev}"))
    for col in ("graph", "steps", "engines", "matches reference", "µs / execute"):
        table.add_column(col)
    all_ok = True
    engines = _engines_for(dev, ())
    if not dev.is_cuda and engines and engines[0] == "triton":
        say(
            "no GPU here: the generated Triton kernels run in Triton's interpreter (correct, but slow: the timings "
            "are the interpreter's), checked against the reference engine"
        )
    for g in graphs:
        with console.status(f"building '{g.name}'..."):
            plan = g.build(device=str(dev), engines=engines)
        result = run_and_verify(plan, seed=seed, repeat=repeat)
        ok = _report(result)
        all_ok &= ok
        table.add_row(
            shown(g.name),
            str(len(plan.steps)),
            shown(", ".join(s.config.engine for s in plan.steps)),
            "yes" if ok else "NO",
            f"{result.us:.1f}",
        )
    console.print(table)
    sys.exit(0 if all_ok else 1)


@main.command()
@_file_arg
@_imports
@user_errors
def check(file: str, imports: tuple[str, ...]) -> None:
    """Validate a graph or plan file and explain any error (a plan file is not compiled)."""
    loaded = _load(file, imports)
    g = loaded.graph
    say(str(g.final))
    if loaded.is_plan:
        from .cli_files import plan_summary

        say(plan_summary(loaded.plan_doc))
    kind = "plan file" if loaded.is_plan else "graph"
    console.print(f"[green]valid[/] {kind}: {len(g.final.nodes)} ops, key {g.key()[:16]}")


@main.command()
@_file_arg
@_device_option
@click.option("--engine", "engines", multiple=True, help="allowed engine (repeatable; graph files)")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1), help="timed runs")
@_imports
@user_errors
def run(
    file: str, device: str | None, engines: tuple[str, ...], seed: int, repeat: int, imports: tuple[str, ...]
) -> None:
    """Run a graph or plan file on random inputs and compare it with the reference engine.

    Weights of matmuls and convolutions are scaled by 1/sqrt(fan-in), as an initialised model's
    are, and each output is compared within its type's tolerance relative to the output's largest
    value. Exit status 1 when an output does not match."""
    from .cli_files import run_and_verify

    loaded = _load(file, imports)
    plan = _plan_of(loaded, device=device, engines=engines)
    with console.status(f"running '{plan.graph.name}'..."):
        result = run_and_verify(plan, seed=seed, repeat=repeat)
    sys.exit(0 if _report(result) else 1)


@main.command()
@_file_arg
@_device_option
@click.option("--engine", "engines", multiple=True, help="allowed engine (repeatable; graph files)")
@click.option("--autotune", is_flag=True, help="time the candidates (cached on disk; graph files)")
@click.option("--dot", "dot_path", type=click.Path(dir_okay=False), help="write the plan as Graphviz DOT")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False), help="draw the plan as SVG (needs Graphviz)")
@_imports
@user_errors
def explain(
    file: str,
    device: str | None,
    engines: tuple[str, ...],
    autotune: bool,
    dot_path: str | None,
    svg_path: str | None,
    imports: tuple[str, ...],
) -> None:
    """Build a graph file (or load a plan file) and explain the plan: pieces, engines, knobs,
    estimates, and why neighbouring ops were not fused."""
    from .draw import plan_to_dot, render_svg

    loaded = _load(file, imports)
    plan = _plan_of(loaded, device=device, engines=engines, autotune=autotune)
    say(plan.describe())
    dot = plan_to_dot(plan)
    if dot_path:
        Path(dot_path).write_text(dot)
        say(f"wrote {dot_path}")
    if svg_path:
        try:
            Path(svg_path).write_bytes(render_svg(dot))
        except (ImportError, RuntimeError, OSError, subprocess.SubprocessError) as err:  # no graphviz, or no `dot`
            errors.print(f"[red]could not draw SVG[/]: {shown(str(err))} (pip install graphviz; apt install graphviz)")
            sys.exit(1)
        say(f"wrote {svg_path}")


@main.command()
@_device_option
@user_errors
def engines(device: str | None) -> None:
    """List the engines and whether each can run here."""
    from ..core.device import resolve_device
    from ..engines import engine_names, get_engine

    dev = resolve_device(device)
    table = Table(title=escape(f"engines on {dev}"))
    table.add_column("engine")
    table.add_column("available")
    for name in engine_names():
        verdict: Any = get_engine(name).available(dev)
        table.add_row(shown(name), "yes" if verdict.ok else shown(f"no: {verdict.reason}"))
    console.print(table)


@main.group()
def cache() -> None:
    """Show or clear opgraph's disk cache (generated kernels, tuning answers)."""


def _cache_problems(problems: tuple[str, ...]) -> None:
    """Each fault of the cache in one line on stderr, then exit 1 (when there are any)."""
    for problem in problems:
        errors.print(f"[red]cache problem[/]: {shown(problem)}")
    if problems:
        sys.exit(1)


@cache.command("info")
@user_errors
def cache_info() -> None:
    """Where the cache is, what it holds and its size cap (exit 1 when a part cannot be read)."""
    from ..core.cache import info

    i = info()
    say(f"cache folder: {i.root}  (OPGRAPH_CACHE_DIR)")
    say(
        f"  generated kernels: {i.kernel_files} files, {i.kernel_bytes / 2**20:.1f} MiB "
        f"(cap {i.cap_bytes / 2**20:.0f} MiB: OPGRAPH_KERNEL_CACHE_MB)"
    )
    say(f"  tuning answers: {i.tuning_entries} entries, {i.tuning_bytes / 1024:.1f} KiB")
    _cache_problems(i.problems)


@cache.command("clear")
@click.option("--kernels/--no-kernels", default=True, show_default=True, help="remove generated kernel sources")
@click.option("--tuning/--no-tuning", default=True, show_default=True, help="remove autotuning answers")
@user_errors
def cache_clear(kernels: bool, tuning: bool) -> None:
    """Delete the cached kernels and tuning answers (both are made again when needed; exit 1 when some
    could not be deleted)."""
    from ..core.cache import clear_report

    done = clear_report(kernels=kernels, tuning=tuning)
    say(f"removed {done.removed} files ({done.freed / 2**20:.1f} MiB)")
    _cache_problems(done.problems)


if __name__ == "__main__":
    main(prog_name="opgraph")
