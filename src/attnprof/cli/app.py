"""The Typer app: global options and one sub-command per module. torch is imported by commands only."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from attnprof.cli.analyze_cmd import analyze_command
from attnprof.cli.check_cmd import check_command
from attnprof.cli.common import STATE
from attnprof.cli.compare_cmd import compare_command
from attnprof.cli.diff_cmd import diff_command
from attnprof.cli.explain_cmd import explain_command
from attnprof.cli.list_cmd import list_command
from attnprof.cli.model_cmd import model_command
from attnprof.cli.plot_cmd import plot_command
from attnprof.cli.report_cmd import report_command
from attnprof.cli.run_cmd import run_command
from attnprof.cli.sweep_cmd import sweep_command


class _FlagsTakeNoValue:
    """Help that shows a flag as a flag. typer's rich help prints each option's type, and a type of
    `<bool>` for an on/off flag such as `--debug` or `--timing/--no-timing`, as though it took a value,
    unless the option has a metavar; every flag (`--help` included) gets the empty one."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The command's parameters, each flag with an empty metavar."""
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class Group(_FlagsTakeNoValue, TyperGroup):
    """The attnprof command group."""


class Command(_FlagsTakeNoValue, TyperCommand):
    """One attnprof command."""


app = typer.Typer(
    name="attnprof",
    cls=Group,
    help="Profile attention in PyTorch: what each implementation really does on the GPU, and why.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from attnprof import __version__

        typer.echo(f"attnprof {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False,
    no_plugins: Annotated[bool, typer.Option("--no-plugins", help="Load only the built-in variants.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Global options, given before the command."""
    STATE.debug = debug
    STATE.no_plugins = no_plugins


app.command("list", cls=Command)(list_command)
app.command("run", cls=Command)(run_command)
app.command("compare", cls=Command)(compare_command)
app.command("sweep", cls=Command)(sweep_command)
app.command("diff", cls=Command)(diff_command)
app.command("check", cls=Command)(check_command)
app.command("model", cls=Command)(model_command)
app.command("analyze", cls=Command)(analyze_command)
app.command("explain", cls=Command)(explain_command)
app.command("plot", cls=Command)(plot_command)
app.command("report", cls=Command)(report_command)


def main() -> None:
    """Console-script entry point."""
    app()
