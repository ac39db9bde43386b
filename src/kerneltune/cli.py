"""The `kerneltune` command.

Each part of the package adds its commands here. The tuner's are registered directly (their
module is light); the others are listed in `OPTIONAL_COMMANDS` and imported only when invoked,
so `kerneltune --help` does not pay for FastAPI, SQLAlchemy or torch, and a command whose part
(or whose optional dependencies) is missing says so when run instead of breaking the rest.
"""

from __future__ import annotations

import importlib
import json
import re
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from kerneltune.tuner.cli import JsonOption
from kerneltune.tuner.cli import register as register_tuner

#: Commands of the other parts: name -> ("module:function", one-line help shown by --help).
#: Add a line per command; the function is a plain typer command function.
OPTIONAL_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kerneltune.api.cli:serve", "Serve tuned configs over HTTP (the config service)."),
}


def extra_for(module: str) -> str:
    """The extra of kerneltune that installs `module` (read from the installed package's
    requirements: the first extra naming its distribution), else 'all'."""
    try:
        requirements = metadata.requires("kerneltune") or []
    except metadata.PackageNotFoundError:
        requirements = []
    top = module.partition(".")[0].lower()
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9_.-]*", requirement).group(0)  # type: ignore[union-attr]
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if extra and name.replace("-", "_").lower() == top and extra.group(1) not in ("all", "dev"):
            return extra.group(1)
    return "all"


def _missing_line(command: str, e: ModuleNotFoundError) -> str:
    """One line: which module a command lacks and which extra installs it."""
    return (f"`kerneltune {command}` needs {e.name}, which is not installed: "
            f"pip install 'kerneltune[{extra_for(e.name or '')}]'")


def _load(name: str) -> TyperCommand:
    """The real command behind an optional name, or one that explains why it is missing."""
    ref, help_text = OPTIONAL_COMMANDS[name]
    module_name, _, attr = ref.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as e:
        why = _missing_line(name, e)
    except (ImportError, AttributeError) as e:
        why = f"`kerneltune {name}` is not available here ({e}); install kerneltune[all]."
    else:
        single = typer.Typer()
        single.command(name)(function)
        command = typer.main.get_command(single)
        command.name = name
        return command  # type: ignore[return-value]

    def missing() -> None:
        typer.echo(why, err=True)
        raise typer.Exit(1)

    return TyperCommand(name, callback=missing, help=help_text)


class _LazyGroup(TyperGroup):
    """Lists optional commands by name and help alone; imports one when it is invoked."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return names + [n for n in OPTIONAL_COMMANDS if n not in names]

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is None and name in OPTIONAL_COMMANDS:
            return TyperCommand(name, help=OPTIONAL_COMMANDS[name][1])  # listing only
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] in OPTIONAL_COMMANDS and args[0] not in self.commands:
            self.add_command(_load(args[0]), args[0])
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        """A command whose extra is not installed ends with one line naming it (the base
        install has torch, Triton, typer and rich; the tuner, service and report need more)."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            if not e.name or e.name.partition(".")[0] == "kerneltune":
                raise
            typer.echo(_missing_line(ctx.invoked_subcommand or "", e), err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="kerneltune",
    cls=_LazyGroup,
    help="Autotuned Triton RMSNorm and LayerNorm kernels: tune per GPU and shape, store, serve, "
    "benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

register_tuner(app)  # tune, export, import


def _show_version(value: bool) -> None:
    if value:
        from kerneltune import __version__

        typer.echo(f"kerneltune {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Show kerneltune's version and exit.")] = False,
) -> None:
    """Autotuned Triton RMSNorm and LayerNorm kernels: tune per GPU and shape, store, serve,
    benchmark."""


@app.command()
def explain(
    kernel: Annotated[str, typer.Argument(help="Kernel name (e.g. rmsnorm_fwd).")],
    n: Annotated[int, typer.Option("--n", "-n", help="Hidden size.")],
    m: Annotated[int, typer.Option("--m", "-m", help="Row count.")],
    dtype: Annotated[str, typer.Option("--dtype", "-d")] = "bfloat16",
    as_json: JsonOption = False,
) -> None:
    """Which table (or default) and config the runtime uses for a call, here."""
    from dataclasses import asdict

    from kerneltune.runtime.resolve import explain as resolve

    try:
        found = resolve(kernel, (m, n, dtype))
    except (KeyError, ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    if not as_json:
        typer.echo(str(found))
        return
    typer.echo(json.dumps({
        "kernel": found.kernel, "n": found.n, "m": m, "dtype": found.dtype,
        "m_bucket": found.m_bucket, "source": found.source, "match": found.match,
        "origin": found.origin, "config": found.config.to_json(),
        "entry": asdict(found.entry) if found.entry is not None else None,
    }, indent=2))


@app.command()
def bench(
    kernel: Annotated[str, typer.Option("--kernel", "-k", help="Kernel name.")] = "rmsnorm_fwd",
    n: Annotated[list[int], typer.Option("--n", "-n", help="Hidden size (repeatable).")] = [4096],  # noqa: B006
    m: Annotated[list[int], typer.Option("--m", "-m", help="Row count (repeatable).")] = [1, 2048],  # noqa: B006
    dtype: Annotated[str, typer.Option("--dtype", "-d")] = "bfloat16",
    as_json: JsonOption = False,
) -> None:
    """Time the config the runtime uses for each shape against the default config, here."""
    from rich.console import Console
    from rich.table import Table

    from kerneltune.benchmark import compare

    try:
        rows = compare(kernel, n, m, dtype)
    except (KeyError, ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    out = Table(title=f"{kernel} {dtype} ({rows[0].method} timing)" if rows else kernel)
    for col in ("N", "M", "source", "µs", "GB/s", "of copy", "default µs", "× default", "config"):
        out.add_column(col, justify="left" if col in ("source", "config") else "right")
    for r in rows:
        frac = f"{r.frac_copy:.2f}" if r.frac_copy is not None else "-"
        config = " ".join(f"{k}={v}" for k, v in r.config.to_json().items())
        out.add_row(str(r.n), str(r.m), f"{r.source} ({r.match})", f"{r.us:.2f}",
                    f"{r.gbps:.0f}", frac, f"{r.default_us:.2f}", f"{r.speedup:.2f}", config)
    Console().print(out)


def _inside_package(path: Path) -> bool:
    """Whether `path` lies in the installed kerneltune package (e.g. its shipped tables)."""
    import kerneltune

    return path.resolve().is_relative_to(Path(kerneltune.__file__).resolve().parent)


@app.command()
def report(
    table_file: Annotated[Path | None, typer.Argument(
        exists=True, dir_okay=False, help="A tuned table (JSON).")] = None,
    bench: Annotated[Path | None, typer.Option(
        "--bench", "-b", exists=True, dir_okay=False,
        help="A result of benchmarks/bench_kernels.py (JSON).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Folder for README.md and the plots (default: beside the table, "
        "else beside the benchmark result; ./out/report for one inside the installed "
        "package).")] = None,
) -> None:
    """Summarise a tuned table and/or a benchmark result as markdown and PNG plots.

    Table: GB/s and fraction of copy bandwidth per entry, tuned against default, against N and
    M. Benchmark: GB/s against N per M for kerneltune and each peer; per kernel, the worst
    shape's fraction of copy and its ratio to the fastest peer.
    """
    from kerneltune.report import BenchError, write_report
    from kerneltune.table import TableError

    if table_file is not None:
        beside = table_file.parent
    elif bench is not None:
        beside = bench.parent
    else:
        raise typer.BadParameter("give a table, --bench, or both")
    if out is None:
        out = Path("out", "report") if _inside_package(beside) else beside
    try:
        md = write_report(out, table_file, bench)
    except (TableError, BenchError) as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(md)


if __name__ == "__main__":
    app()
