"""What the commands share: option aliases, the error edge, output streams, config loading."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from attnprof.errors import AttnprofError


class OutputFormat(str, Enum):
    """How results are written to stdout."""

    table = "table"
    markdown = "markdown"
    json = "json"


@dataclass
class GlobalState:
    """Options given before the command name."""

    debug: bool = False
    no_plugins: bool = False


STATE = GlobalState()

FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f", help="table, markdown or json (json: stdout holds only the JSON document).")]
ConfigArg = Annotated[Optional[Path], typer.Argument(help="YAML config; the built-in default when omitted.", show_default=False)]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config; the built-in default when omitted.", show_default=False)]
DeviceOpt = Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N (overrides the config).", show_default=False)]
DtypeOpt = Annotated[Optional[str], typer.Option(help="bf16, fp16 or fp32 (overrides the config).", show_default=False)]
BatchOpt = Annotated[Optional[int], typer.Option(help="Batch size (overrides the config's shapes).", show_default=False)]
HeadsOpt = Annotated[Optional[int], typer.Option(help="Query heads.", show_default=False)]
KvHeadsOpt = Annotated[Optional[int], typer.Option("--kv-heads", help="Key/value heads (GQA).", show_default=False)]
SeqOpt = Annotated[Optional[int], typer.Option(help="Sequence length.", show_default=False)]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="Head dimension.", show_default=False)]
CausalOpt = Annotated[Optional[bool], typer.Option("--causal/--no-causal", help="Causal masking.", show_default=False)]
OutputDirOpt = Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where traces and results go.", show_default=False)]
RegionOpt = Annotated[Optional[str], typer.Option(help="Name of the record_function region around each forward.", show_default=False)]
SeedOpt = Annotated[Optional[int], typer.Option(help="Seed for the inputs.", show_default=False)]
WaitOpt = Annotated[Optional[int], typer.Option(help="Profiler schedule: steps skipped.", show_default=False)]
WarmupOpt = Annotated[Optional[int], typer.Option(help="Profiler schedule: warm-up steps.", show_default=False)]
ActiveOpt = Annotated[Optional[int], typer.Option(help="Profiler schedule: recorded steps.", show_default=False)]
TimingOpt = Annotated[bool, typer.Option("--timing/--no-timing", help="Time the forward outside the profiler (latency, memory, throughput).")]
MinTimeOpt = Annotated[float, typer.Option("--min-time", help="Seconds of timed repetitions per cell.")]
CudaGraphOpt = Annotated[bool, typer.Option("--cuda-graph", help="Time CUDA-graph replays (many forwards per graph) where the variant allows capture.")]
FlushL2Opt = Annotated[bool, typer.Option("--flush-l2", help="Flush the L2 cache between timed calls.")]
RefreshCeilingOpt = Annotated[bool, typer.Option("--refresh-ceiling", help="Measure the matmul ceiling again instead of using the cached figure.")]
ClocksOpt = Annotated[bool, typer.Option("--clocks/--no-clocks", help="Sample the GPU's SM clock with nvidia-smi while timing (CUDA only).")]
MaskingOpt = Annotated[bool, typer.Option("--check-masking", help="Probe fully masked rows and report NaN per variant.")]


def stderr_console() -> Any:
    """A rich console on stderr, for progress and notes."""
    from rich.console import Console

    return Console(stderr=True)


def emit(text: str) -> None:
    """Write a result to stdout."""
    typer.echo(text)


def note(text: str) -> None:
    """Write a note to stderr, never mixing with results on stdout."""
    typer.echo(text, err=True)


def fail(message: str, hint: str | None = None, code: int = 1, as_json: bool = False) -> None:
    """Print a one-line error (and an optional hint) and exit with `code`."""
    if as_json:
        typer.echo(json.dumps({"error": message, "hint": hint}))
    first, *rest = message.splitlines() or [""]
    typer.echo(f"error: {first}", err=True)
    for line in rest:
        typer.echo(line, err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn attnprof errors into one-line messages; anything else too, unless --debug."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = getattr(kwargs.get("fmt"), "value", None) == "json"
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except AttnprofError as exc:
            if STATE.debug:
                raise
            fail(exc.message, exc.hint, exc.exit_code, as_json)
        except KeyboardInterrupt:
            fail("interrupted", code=130, as_json=as_json)
        except Exception as exc:
            if STATE.debug:
                raise
            text = str(exc).strip().splitlines()
            detail = f": {text[0]}" if text else ""
            fail(f"unexpected {type(exc).__name__}{detail}", "run with --debug for the traceback", 1, as_json)

    return wrapper


def load_variants_for_cli() -> Any:
    """The registry, honouring --no-plugins and ATTNPROF_PLUGINS."""
    from attnprof.plugins import load_variants

    return load_variants(no_plugins=STATE.no_plugins)


def plugin_notes(loaded: Any) -> list[str]:
    """One line per plugin that failed to load or register."""
    return [f"plugin {p.package} ({p.entry_point}): {p.error}" for p in loaded.problems]
