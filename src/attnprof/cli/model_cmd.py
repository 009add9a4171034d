"""`attnprof model`: one model's forward (or training step) under several attention implementations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import cell_progress, counters_text, note_outputs
from attnprof.config import MODEL_NCU_LAUNCHES

if TYPE_CHECKING:
    from attnprof.model_config import ModelConfig
    from attnprof.models.implementations import Implementation
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.counters import CounterCollector
    from attnprof.pipeline.measured import ModelResult


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [item.strip() for item in text.split(",") if item.strip()]


def _option(*names: str, help: str, metavar: str | None = None) -> Any:
    """An option that overrides the config; not given (None), the config decides."""
    return typer.Option(*names, metavar=metavar, help=help, show_default=False)


LIST = "LIST"  # the metavar of comma-separated values
ConfigArg = Annotated[
    Path | None,
    typer.Argument(
        help="The model config (YAML; or give it with -c). Without one, --hf or --model names the model.",
        show_default=False,
    ),
]
ConfigOpt = Annotated[Path | None, _option("--config", "-c", help="The model config (YAML), if not the argument.")]
HfOpt = Annotated[
    str | None,
    _option("--hf", metavar="TYPE", help="A transformers model type (llama, ...), sized by the config's hf_config."),
]
FactoryOpt = Annotated[
    str | None, _option("--model", metavar="PKG.MOD:FN", help="A callable returning (model, example_inputs).")
]
AttnOpt = Annotated[
    str | None,
    _option(
        "--attn",
        metavar=LIST,
        help="Comma-separated implementations: transformers' eager, sdpa, flex_attention, ... and attnprof variants "
        "(triton-flash; attnprof:sdpa for attnprof's sdpa).",
    ),
]
BaselineOpt = Annotated[str | None, _option("--baseline", help="What speed-ups and logits are compared with.")]
SeqOpt = Annotated[str | None, _option("--seq", metavar=LIST, help="Comma-separated sequence lengths.")]
BatchOpt = Annotated[int | None, _option("--batch", help="Batch size.")]
ModeOpt = Annotated[str | None, _option("--mode", metavar="fwd|fwd+bwd", help="fwd, fwd+bwd (training step) or both.")]
RegionOpt = Annotated[str | None, _option("--region", help="The record_function range around each step.")]
SeedOpt = Annotated[int | None, _option("--seed", help="Seed for the weights and the inputs.")]
MinTimeOpt = Annotated[float | None, _option("--min-time", help="Seconds of timed steps per row.")]
OutputOpt = Annotated[Path | None, _option("--output-dir", "-o", help="Where traces and results go.")]
NcuOpt = Annotated[
    bool,
    typer.Option(
        "--ncu",
        help="After each row's measurement, run its step again under Nsight Compute and attach the hardware "
        "counters of its attention kernels; about 10-30 s per row on a GPU. The report is written beside the "
        "row's trace.",
    ),
]
NcuLaunchesOpt = Annotated[
    int,
    typer.Option(
        "--ncu-launches",
        metavar="N",
        min=1,
        help="With --ncu: attention-kernel launches profiled per row at most (the first layers' in a step).",
    ),
]


@c.handle_errors
def model_command(
    config: ConfigArg = None,
    config_file: ConfigOpt = None,
    hf: HfOpt = None,
    factory: FactoryOpt = None,
    attn: AttnOpt = None,
    baseline: BaselineOpt = None,
    seq: SeqOpt = None,
    batch: BatchOpt = None,
    mode: ModeOpt = None,
    device: c.DeviceOpt = None,
    dtype: c.DtypeOpt = None,
    region: RegionOpt = None,
    seed: SeedOpt = None,
    min_time: MinTimeOpt = None,
    output_dir: OutputOpt = None,
    ncu: NcuOpt = False,
    ncu_launches: NcuLaunchesOpt = MODEL_NCU_LAUNCHES,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
) -> None:
    """Profile a whole model under several attention implementations and compare them in one table.

    Options override the config's values."""
    from attnprof.errors import ConfigError
    from attnprof.pipeline.counters import CounterCollector
    from attnprof.pipeline.model import plan_implementations

    try:
        seqs = [int(s) for s in _list(seq) or []] or None
    except ValueError:
        raise ConfigError(f"--seq: expected comma-separated whole numbers (got {seq!r})") from None
    cfg = _config(
        c.config_path(config, config_file),
        hf=hf,
        factory=factory,
        min_time=min_time,
        implementations=_list(attn),
        baseline=baseline,
        seq=seqs,
        batch=batch,
        modes=_list(mode),
        device=device,
        dtype=dtype,
        region=region,
        seed=seed,
        output_dir=str(output_dir) if output_dir is not None else None,
    )
    loaded = c.load_variants_for_cli()
    for line in c.plugin_notes(loaded):
        c.note(line)
    implementations = plan_implementations(cfg, loaded.registry)  # an unknown name fails before torch loads
    outcome = _run(cfg, implementations, CounterCollector(ncu_launches) if ncu else None)
    _print(outcome, fmt, c.table_width(fmt, wide))
    note_outputs(outcome)
    raise typer.Exit(outcome.exit_code)


def _config(
    path: Path | None, hf: str | None, factory: str | None, min_time: float | None, **overrides: Any
) -> ModelConfig:
    """The model config file (or, without one, the model given by --hf or --model) with the options applied."""
    from attnprof.config import validate_mapping
    from attnprof.errors import ConfigError
    from attnprof.model_config import ModelConfig, apply_model_overrides, load_model_config

    if path is not None:
        cfg = load_model_config(path)
    elif hf is None and factory is None:
        raise ConfigError(
            "no model given", hint="give a model config (configs/model-cpu.yaml), --hf TYPE or --model PKG.MOD:FN"
        )
    else:
        cfg = validate_mapping(ModelConfig, {"hf": hf} if hf else {"factory": factory}, "command-line options")
    timing = None if min_time is None else cfg.timing.model_dump() | {"min_time_s": min_time}
    return apply_model_overrides(cfg, MODEL_OPTIONS, hf=hf, factory=factory, timing=timing, **overrides)


#: Where the user typed each model config field an option sets (`config.FieldNames`), for the errors.
MODEL_OPTIONS = {
    ("hf",): "--hf",
    ("factory",): "--model",
    ("implementations",): "--attn",
    ("baseline",): "--baseline",
    ("seq",): "--seq",
    ("batch",): "--batch",
    ("modes",): "--mode",
    ("device",): "--device",
    ("dtype",): "--dtype",
    ("region",): "--region",
    ("seed",): "--seed",
    ("timing", "min_time_s"): "--min-time",
    ("output_dir",): "--output-dir",
}


def _run(
    cfg: ModelConfig, implementations: list[Implementation], counters: CounterCollector | None
) -> RunOutcome[ModelResult]:
    """Open the model, run every row with a progress display on stderr (with `counters`, each row's Nsight
    Compute pass), and write the results."""
    from attnprof.pipeline.counters import refuse_counters
    from attnprof.pipeline.model import model_rows, open_model, resolve_model_config, run_model_job
    from attnprof.profiling.inputs import resolve_torch_device

    device = resolve_torch_device(cfg.device)
    if counters is not None:
        refuse_counters(device)  # before the model is built
    cfg = resolve_model_config(cfg, device)
    source, implementations, note = open_model(cfg, device, implementations)
    if note:
        c.note(note)
    if cfg.hf is not None and not cfg.hf_config:
        c.note(f"hf_config is empty: {cfg.hf} is built at transformers' default size for it")
    with cell_progress(model_rows(source, cfg, implementations)) as shown:

        def on_start(index: int, total: int, label: str) -> None:
            shown.progress.update(shown.task, description=label)
            if not shown.terminal:
                c.note(f"[{index + 1}/{total}] {label} {cfg.dtype} on {device}")

        def on_done(result: ModelResult) -> None:
            shown.progress.advance(shown.task)
            if not result.ok:
                c.note(f"  {result.label}: {result.status}: {result.reason}")
            shown.counters_note(result.ncu_note)
            if c.STATE.debug:
                for line in result.native_stderr + result.warnings:
                    c.note(f"  {result.label}: {line}")

        outcome = run_model_job(
            source, cfg, implementations, device, on_start, on_done, counters, shown.counters_started
        )
    if outcome.interrupted:
        c.note(f"interrupted: keeping the {len(outcome.results)} finished row(s)")
    if counters is not None:
        c.note(counters_text(outcome.document.ncu, len(outcome.results)))
    return outcome


def _print(outcome: RunOutcome[ModelResult], fmt: c.OutputFormat, width: int | None) -> None:
    from attnprof.report.model_tables import model_report
    from attnprof.results.files import to_json

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    if outcome.document.results:
        c.emit(model_report(outcome.document.results, fmt.value, outcome.results[0].variant, width))
