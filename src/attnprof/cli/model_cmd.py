"""`attnprof model`: one model's forward (or training step) under several attention implementations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import cell_progress, counters_text, note_outputs
from attnprof.cli.options import MODEL_CONFIG_FIELDS, SCHEDULE_FIELDS, shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.model_config import ModelConfig
    from attnprof.models.implementations import Implementation
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.counters import CounterCollector
    from attnprof.pipeline.measured import CellResult


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
TimeFixesOpt = Annotated[
    bool,
    typer.Option(
        "--time-fixes/--no-time-fixes",
        help="Time what each row's findings propose (fused SDPA for unfused attention, is_causal for a dense mask, "
        "the mask converted once, a fused backend, bf16 GEMMs) at the shapes its trace recorded, on this machine: "
        "the measured saving becomes the finding's impact, labelled timed (about 10 s at most per row).",
    ),
]
ModeOpt = Annotated[str | None, _option("--mode", metavar="fwd|fwd+bwd", help="fwd, fwd+bwd (training step) or both.")]


@c.handle_errors
@shared_options(model=True)
def model_command(
    config: ConfigArg = None,
    config_file: ConfigOpt = None,
    hf: HfOpt = None,
    factory: FactoryOpt = None,
    attn: AttnOpt = None,
    baseline: BaselineOpt = None,
    seq: SeqOpt = None,
    mode: ModeOpt = None,
    time_fixes: TimeFixesOpt = True,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Profile a whole model under several attention implementations and compare them in one table.

    Options override the config's values; the measurement options are compare's, those that apply to a
    whole model's step."""
    from attnprof.errors import ConfigError
    from attnprof.pipeline.counters import CounterCollector
    from attnprof.pipeline.model import plan_implementations

    try:
        seqs = [int(s) for s in _list(seq) or []] or None
    except ValueError:
        raise ConfigError(f"--seq: expected comma-separated whole numbers (got {seq!r})") from None
    given = {name: overrides[name] for name in MODEL_CONFIG_FIELDS if name not in SCHEDULE_FIELDS}
    if given["output_dir"] is not None:
        given["output_dir"] = str(given["output_dir"])
    cfg = _config(
        c.config_path(config, config_file),
        hf=hf,
        factory=factory,
        min_time=measure.min_time_s if "min_time_s" in measure.model_fields_set else None,
        schedule={name: overrides[name] for name in SCHEDULE_FIELDS},
        implementations=_list(attn),
        baseline=baseline,
        seq=seqs,
        modes=_list(mode),
        **given,
    )
    # the results say what was used
    measure = measure.model_copy(update={"min_time_s": cfg.timing.min_time_s, "time_fixes": time_fixes})
    loaded = c.load_variants_for_cli()
    for line in c.plugin_notes(loaded):
        c.note(line)
    implementations = plan_implementations(cfg, loaded.registry)  # an unknown name fails before torch loads
    outcome = _run(cfg, implementations, measure, CounterCollector(measure.ncu_launches) if measure.ncu else None)
    _print(outcome, fmt, c.table_width(fmt, wide))
    note_outputs(outcome)
    raise typer.Exit(outcome.exit_code)


def _config(
    path: Path | None,
    hf: str | None,
    factory: str | None,
    min_time: float | None,
    schedule: dict[str, int | None],
    **overrides: Any,
) -> ModelConfig:
    """The model config file (or, without one, the model given by --hf or --model) with the options applied:
    --min-time onto its `timing`, --wait, --warmup and --active onto its `schedule`."""
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
    steps = {name: value for name, value in schedule.items() if value is not None}
    profiled = cfg.schedule.model_dump() | steps if steps else None
    return apply_model_overrides(
        cfg, MODEL_OPTIONS, hf=hf, factory=factory, timing=timing, schedule=profiled, **overrides
    )


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
    ("schedule", "wait"): "--wait",
    ("schedule", "warmup"): "--warmup",
    ("schedule", "active"): "--active",
    ("output_dir",): "--output-dir",
}


def _run(
    cfg: ModelConfig, implementations: list[Implementation], measure: MeasureOptions, counters: CounterCollector | None
) -> RunOutcome:
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

        def on_done(result: CellResult) -> None:
            shown.progress.advance(shown.task)
            if not result.ok:
                c.note(f"  {result.label}: {result.status}: {result.reason}")
            shown.counters_note(result.ncu_note)
            shown.health_note(result.gpu_health_note)
            if c.STATE.debug:
                for line in result.native_stderr + result.warnings:
                    c.note(f"  {result.label}: {line}")

        outcome = run_model_job(
            source, cfg, implementations, device, measure, on_start, on_done, counters, shown.counters_started
        )
    if outcome.interrupted:
        c.note(f"interrupted: keeping the {len(outcome.results)} finished row(s)")
    if counters is not None:
        c.note(counters_text(outcome.document.ncu, len(outcome.results)))
    return outcome


def _print(outcome: RunOutcome, fmt: c.OutputFormat, width: int | None) -> None:
    from attnprof.report.model_tables import model_report
    from attnprof.results.files import to_json

    c.warn_contended(outcome.document.results, fmt, width)
    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    if outcome.document.results:
        c.emit(model_report(outcome.document.results, fmt.value, outcome.results[0].variant, width))
