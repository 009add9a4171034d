"""A whole run or compare: choose cells, measure the ceiling, build the result document."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from attnprof.config import Config
from attnprof.profiling.results import ROW_FIELDS, result_document, result_rows
from attnprof.profiling.runner import CellResult, RunOptions, cell_specs
from attnprof.registry import Registry, RunSpec, Variant


def run_options(config: Config, **measure: Any) -> RunOptions:
    """RunOptions from the config plus the measurement flags of the command line."""
    return RunOptions(schedule=config.schedule, region=config.region, seed=config.seed,
                      output_dir=Path(config.output_dir), **measure)


def plan_cells(config: Config, variants: list[Variant], device: str) -> list[tuple[Variant, RunSpec]]:
    """Every shape × every variant, shape-major so each comparison table fills in turn."""
    return [(variant, spec) for spec in cell_specs(config, device) for variant in variants]


def select_variants(config: Config, registry: Registry) -> list[Variant]:
    """The config's include/exclude patterns applied to the registry."""
    return registry.select(config.variants, config.exclude)


def measure_ceiling(device: str, dtype: str, refresh: bool = False) -> Any:
    """The device's measured matmul and copy ceilings (cached per device, dtype and torch version;
    `refresh` measures again and replaces the cached figure)."""
    from attnprof.profiling.ceiling import device_ceiling

    return device_ceiling(device, dtype, refresh=refresh)


def result_file_stem(command: str) -> str:
    """`compare-YYYYmmdd-HHMMSS`: results accumulate instead of overwriting."""
    return f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_document(command: str, config: Config, device: str, results: list[CellResult],
                   ceiling: Any, interrupted: bool) -> dict[str, Any]:
    """The self-contained JSON document: environment, config, ceiling and every result."""
    from attnprof import __version__
    from attnprof.profiling.environment import collect_environment

    return {
        "attnprof_version": __version__,
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "interrupted": interrupted,
        "environment": collect_environment(device),
        "config": config.model_dump(mode="json"),
        "ceiling": None if ceiling is None else ceiling.to_dict(),
        "results": result_document(results, config.baseline),
    }


def write_outputs(stem: str, output_dir: Path, document: dict[str, Any], results: list[CellResult],
                  baseline: str | None) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.csv` next to the traces."""
    from attnprof.report.export import write_csv, write_json

    json_path = write_json(output_dir / f"{stem}.json", document)
    csv_path = write_csv(output_dir / f"{stem}.csv", result_rows(results, baseline), ROW_FIELDS)
    return json_path, csv_path
