"""`attnprof sweep --resume`: read an earlier sweep's stream, keep its finished cells, and refuse to
continue it with settings that would change what a cell measures.

Kept: rows that are ok, skipped (this machine cannot run the cell, or the OOM rule), or failed
because the cell ran out of memory (it would again). Any other failure is transient as far as a
resume knows (a crash, a driver hiccup), so that cell runs again. A cell cut short by the
interrupt has no row and runs again, as does one whose line a crash left incomplete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnprof.config import Config, MeasureOptions, parse_config
from attnprof.errors import ConfigError, ResultsFileError
from attnprof.pipeline.sweep import ran_out_of_memory
from attnprof.report.results_file import JSONL_FORMAT, ResultsFile, load_results

STREAM_NAME = "results.jsonl"
#: Config fields that change what a cell measures without being part of its key.
CONFIG_MEANING = ("schedule", "seed", "region")
#: Measurement options that change what a cell measures (the others do not: clocks, refresh_ceiling).
MEASURE_MEANING = ("timing", "min_time_s", "cuda_graph", "flush_l2", "check_masking")


def open_previous(path: Path) -> ResultsFile:
    """The stream of the sweep to resume: `path` itself, or `results.jsonl` in the folder `path`.
    ResultsFileError (exit 2) for anything but a sweep's results stream."""
    path = path / STREAM_NAME if path.is_dir() else path
    previous = load_results(path)
    if previous.header.get("format") != JSONL_FORMAT or previous.command != "sweep":
        raise ResultsFileError(
            f"{path}: not the results stream of a sweep", hint="--resume takes a sweep's folder or its results.jsonl"
        )
    return previous


def recorded_config(previous: ResultsFile) -> Config:
    """The config the earlier sweep ran with, as recorded in its stream."""
    return parse_config(previous.header.get("config"), f"{previous.path} (its recorded config)")


def inherit_measure(measure: MeasureOptions, previous: ResultsFile) -> MeasureOptions:
    """`measure` with each option left at its default taken from the earlier sweep instead."""
    recorded = previous.header.get("measure") or {}
    defaults = MeasureOptions()
    given = measure.model_dump()
    inherited = {
        name: recorded[name] for name, value in given.items() if value == getattr(defaults, name) and name in recorded
    }
    return MeasureOptions(**(given | inherited)) if inherited else measure


def check_resumable(previous: ResultsFile, config: Config, measure: MeasureOptions, device: str) -> None:
    """ConfigError (exit 2) naming each setting that differs from the earlier sweep's and changes what
    a cell measures: the device, the profiler schedule, the seed, the region, the timing options.
    (Variants, shapes, axes and the baseline may differ: they choose cells, they do not change one.)"""
    recorded = previous.header.get("config") or {}
    now = config.model_dump(mode="json")
    was_measure = previous.header.get("measure") or {}
    differences = []
    was_device = previous.environment.get("device")
    if was_device != device:
        differences.append(f"device {was_device} (now {device})")
    differences += [
        f"{name} {recorded.get(name)} (now {now[name]})" for name in CONFIG_MEANING if recorded.get(name) != now[name]
    ]
    differences += [
        f"{name} {was_measure.get(name)} (now {getattr(measure, name)})"
        for name in MEASURE_MEANING
        if was_measure.get(name) != getattr(measure, name)
    ]
    if differences:
        raise ConfigError(
            f"cannot resume {previous.path}: it ran with {'; '.join(differences)}",
            hint="resume with the settings it ran with, or start a new sweep",
        )


def kept_rows(previous: ResultsFile) -> list[dict[str, Any]]:
    """The rows of finished cells that a resume keeps (see the module's docstring)."""
    return [
        row
        for row in previous.rows
        if (status := str(row.get("status", ""))) == "ok"
        or status.startswith("skipped")
        or ran_out_of_memory(status, row.get("reason"))
    ]
