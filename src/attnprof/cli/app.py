"""The Typer app: global options and one sub-command per module. torch is imported by commands only.

Each command's module is imported, and its click command built, when the command runs or its help
page is shown: `attnprof analyze` never imports the config models (pydantic) that `run` and `compare`
need, and `attnprof --help` lists the commands by their `SUMMARIES` without importing any of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from attnprof.cli.common import STATE

#: name -> (module, function), in the order help lists them
COMMANDS = {
    "list": ("attnprof.cli.list_cmd", "list_command"),
    "run": ("attnprof.cli.run_cmd", "run_command"),
    "compare": ("attnprof.cli.compare_cmd", "compare_command"),
    "sweep": ("attnprof.cli.sweep_cmd", "sweep_command"),
    "diff": ("attnprof.cli.diff_cmd", "diff_command"),
    "check": ("attnprof.cli.check_cmd", "check_command"),
    "model": ("attnprof.cli.model_cmd", "model_command"),
    "analyze": ("attnprof.cli.analyze_cmd", "analyze_command"),
    "explain": ("attnprof.cli.explain_cmd", "explain_command"),
    "findings": ("attnprof.cli.findings_cmd", "findings_command"),
    "plot": ("attnprof.cli.plot_cmd", "plot_command"),
    "report": ("attnprof.cli.report_cmd", "report_command"),
}
#: name -> the first line of its command's docstring, which `attnprof --help` lists (a test holds them equal)
SUMMARIES = {
    "list": "List every variant, whether it can run here, and if not, why not.",
    "run": "Profile one variant with torch.profiler and print its per-forward facts.",
    "compare": "Profile every selected variant at every configured shape and compare them.",
    "sweep": "Run every selected variant at every point of the config's sweep axes (their cross product).",
    "diff": "Compare two results files row by row (variant, shape, dtype, causal, mode).",
    "check": "Check each variant's results against declared expectations: ✓ held, ✗ missed, – not run, ? not judged.",
    "model": "Profile a whole model under several attention implementations and compare them in one table.",
    "analyze": "Analyse a trace: attribute GPU work to each forward and explain what it shows.",
    "explain": "Decode a GPU kernel name: library, algorithm, dtype, tile, architecture, tensor cores.",
    "findings": "List every finding attnprof reports, with its severity and summary, or one in full.",
    "plot": "Plot a results file: latency bars; latency, throughput, memory, kernels against sequence length; "
    "GPU against CPU.",
    "report": "Write one self-contained HTML report: headline, plots, tables, findings, kernels and traces.",
}


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


class Command(_FlagsTakeNoValue, TyperCommand):
    """One attnprof command."""


class _Commands(MutableMapping):
    """The group's commands by name (`COMMANDS` first): each is built on first use."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}
        self.listing = False  # while the group's help lists them: summaries only, nothing imported

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            if self.listing:
                return Command(name, help=SUMMARIES[name])
            module, function = COMMANDS[name]
            single = typer.Typer(add_completion=False)
            single.command(name, cls=Command)(getattr(importlib.import_module(module), function))
            self._built[name] = typer.main.get_command(single)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(1 for name in self._built if name not in COMMANDS)


class Group(_FlagsTakeNoValue, TyperGroup):
    """The attnprof command group; its commands are built when first used (see `COMMANDS`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        given, self.commands = self.commands, _Commands()
        self.commands.update(given)

    def list_commands(self, ctx: Any) -> list[str]:
        """The command names, in `COMMANDS` order."""
        return list(self.commands)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The group's help, listing each command by its summary (see `SUMMARIES`)."""
        commands = self.commands
        commands.listing = True  # type: ignore[attr-defined]
        try:
            super().format_help(ctx, formatter)
        finally:
            commands.listing = False  # type: ignore[attr-defined]


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
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help="Show tracebacks instead of one-line errors, and the notes kept off the terminal otherwise."
        ),
    ] = False,
    no_plugins: Annotated[bool, typer.Option("--no-plugins", help="Load only the built-in variants.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Global options, given before the command."""
    STATE.debug = debug
    STATE.no_plugins = no_plugins


def main() -> None:
    """Console-script entry point. Output cut short by its reader (`attnprof --help | head -1`) ends
    quietly with exit 0, as in the commands (`common.reader_gone`), where click would exit 1."""
    try:
        app()
    except SystemExit as done:
        if done.code == 1 and _broken_pipe(done):
            from attnprof.cli.common import reader_gone

            try:
                reader_gone()
            except typer.Exit:
                raise SystemExit(0) from None
        raise


def _broken_pipe(error: BaseException) -> bool:
    """True when a BrokenPipeError is among the exceptions that led to `error`."""
    seen = error.__context__
    while seen is not None:
        if isinstance(seen, BrokenPipeError):
            return True
        seen = seen.__context__
    return False
