"""`attnprof model`: one model under several attention implementations, one row per implementation × seq
× mode, then the results written into the invocation's own folder (`results.json`, `results.csv`,
`traces/`), like `run` and `compare`.

The baseline implementation runs first (its logits are what the others are compared with), then the
others in the order given. An hf model is built once per implementation; the SM clock is sampled on a
GPU; Ctrl-C stops at once and keeps the finished rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from attnprof.config import MeasureOptions
from attnprof.interrupts import interrupt_requested, raise_if_interrupted, recording_interrupts
from attnprof.model_config import ModelConfig
from attnprof.models.factory import AS_BUILT
from attnprof.models.implementations import Implementation, resolve_implementations
from attnprof.models.source import FactorySource, ModelSource, open_source
from attnprof.pipeline.counters import CounterCollector, refuse_counters
from attnprof.pipeline.measured import CellResult, attach_speedups
from attnprof.pipeline.model_row import run_row
from attnprof.pipeline.run import RunFolder, RunOutcome, attach_clocks, clock_sampler, open_run_folder
from attnprof.variant_registry import Registry


def plan_implementations(config: ModelConfig, registry: Registry) -> list[Implementation]:
    """The configured implementations resolved (unknown names fail here, before torch is imported), the
    baseline first. A factory model may take names of its own."""
    implementations = resolve_implementations(config.implementations, registry, passthrough=config.factory is not None)
    baseline = config.baseline_name
    return sorted(implementations, key=lambda i: i.name != baseline)


def resolve_model_config(config: ModelConfig, device: str) -> ModelConfig:
    """`config` with `dtype: auto` made concrete for the resolved `device` (`devices.resolve_dtype`)."""
    from attnprof.devices import resolve_dtype

    dtype = resolve_dtype(config.dtype, device)
    return config if dtype == config.dtype else config.model_copy(update={"dtype": dtype})


def open_model(
    config: ModelConfig, device: str, implementations: list[Implementation]
) -> tuple[ModelSource, list[Implementation], str | None]:
    """The model's source and the implementations to run, plus a note when a factory model cannot have its
    attention swapped (it is then profiled as built, in one row per seq and mode). One-line errors for a
    missing transformers, an unknown model type or config field, and a factory that cannot be imported
    or raises while probed."""
    source = open_source(config, device, config.dtype, implementations)
    if isinstance(source, FactorySource) and not source.swappable():
        note = (
            f"{config.factory} exposes no way to choose its attention (no attn_implementation keyword, no "
            f"set_attn_implementation): profiled as built, not under {', '.join(i.name for i in implementations)}"
        )
        return source, [Implementation(AS_BUILT, None)], note
    return source, implementations, None


def model_rows(source: ModelSource, config: ModelConfig, implementations: list[Implementation]) -> int:
    """How many rows the run has."""
    return len(implementations) * len(source.seqs) * len(config.modes)


def run_model(
    source: ModelSource,
    config: ModelConfig,
    implementations: list[Implementation],
    device: str,
    trace_dir: Path,
    measure: MeasureOptions,
    on_start: Callable[[int, int, str], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
    counters: CounterCollector | None = None,
    on_counters: Callable[[int, int, str], None] | None = None,
) -> tuple[list[CellResult], bool]:
    """Run every row (see the module docstring); returns the rows and whether Ctrl-C cut the run short.
    `on_start(index, total, label)` and `on_done(result)` report progress. With `counters` (--ncu) each ok
    row's step runs again under Nsight Compute, its attention kernels only (`pipeline.counters`;
    `on_counters(index, total, label)` is told as the pass starts), before `on_done`. `measure` holds the
    measurement flags the command shares with `compare` (`--no-timing`, `--flush-l2`, `--no-clocks`, ...)."""
    results: list[CellResult] = []
    references: dict[tuple[int | None, str], Any] = {}
    total = model_rows(source, config, implementations)
    baseline = implementations[0].name  # plan_implementations put it first
    interrupted = False
    sampler = clock_sampler(device, measure)
    try:
        with recording_interrupts():
            try:
                for implementation in implementations:
                    for seq in source.seqs:
                        for mode in config.modes:
                            raise_if_interrupted()
                            if on_start:
                                seq_text = f" @ seq {seq}" if seq is not None else ""
                                on_start(len(results), total, f"{implementation.name}{seq_text} {mode}")
                            result = run_row(
                                source,
                                implementation,
                                seq,
                                mode,
                                config,
                                measure,
                                device,
                                trace_dir,
                                references,
                                baseline,
                            )
                            if counters is not None:
                                told = partial(on_counters, len(results), total, result.label) if on_counters else None
                                counters.collect_model_row(result, config, implementations, told)
                            if interrupt_requested():
                                raise KeyboardInterrupt
                            results.append(result)
                            if on_done:
                                on_done(result)
                    source.release()
            except KeyboardInterrupt:
                interrupted = True
    finally:
        source.release()
        if sampler is not None:
            attach_clocks(results, sampler.device, sampler.stop())
    attach_speedups(results, baseline)
    return results, interrupted


def run_model_job(
    source: ModelSource,
    config: ModelConfig,
    implementations: list[Implementation],
    device: str,
    measure: MeasureOptions,
    on_start: Callable[[int, int, str], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
    counters: CounterCollector | None = None,
    on_counters: Callable[[int, int, str], None] | None = None,
) -> RunOutcome:
    """A whole `attnprof model`: its own folder, every row (`run_model`, Ctrl-C keeps the finished ones;
    with `counters`, each row's Nsight Compute pass, refused before the folder exists where it cannot give
    counters: `refuse_counters`), then the results written into the folder (`finish_model_run`). Ctrl-C
    before any row finished removes the folder and raises NothingFinishedError (`RunFolder.discard`)."""
    if counters is not None:
        refuse_counters(device)
    folder = open_run_folder(Path(config.output_dir), "model")
    try:
        results, interrupted = run_model(
            source, config, implementations, device, folder.traces, measure, on_start, on_done, counters, on_counters
        )
    except KeyboardInterrupt:  # outside the rows' loop: none finished
        results, interrupted = [], True
    if interrupted and not results:
        raise folder.discard()
    return finish_model_run(config, device, results, interrupted, folder, measure, counters)


def finish_model_run(
    config: ModelConfig,
    device: str,
    results: list[CellResult],
    interrupted: bool,
    folder: RunFolder,
    measure: MeasureOptions,
    counters: CounterCollector | None = None,
) -> RunOutcome:
    """Write the rows as `results.json` (the results document, `command` "model", with the measurement flags
    as `measure`, as compare's; with `counters`, what --ncu did as `ncu`) and `results.csv` into `folder`."""
    from attnprof.pipeline.rows import cell_row, results_document
    from attnprof.profiling.environment import collect_environment, package_version
    from attnprof.results.files import write_csv, write_json

    environment = collect_environment(device)
    environment["transformers"] = package_version("transformers")
    rows = [cell_row(r) for r in results]
    document = results_document("model", config, environment, None, rows, interrupted, files=folder.to_dict())
    document.measure = measure.model_dump(mode="json")
    if counters is not None:
        document.ncu = counters.summary()
    write_json(folder.results_json, document)
    write_csv(folder.results_csv, rows, "model")
    return RunOutcome("model", results, document, folder, interrupted)
