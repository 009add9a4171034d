"""`attnprof compare`: every selected variant at every shape, side by side."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import Measure, execute, exit_code
from attnprof.cli.settings import build_config

PatternsOpt = Annotated[Optional[list[str]], typer.Option("--variants", help="Include pattern, e.g. 'sdpa-*' (repeatable; replaces the config's variants and exclude).", show_default=False)]
ExcludeOpt = Annotated[Optional[list[str]], typer.Option("--exclude", help="Exclude pattern (repeatable; overrides the config).", show_default=False)]
BaselineOpt = Annotated[Optional[str], typer.Option(help="Variant the speed-ups are relative to.", show_default=False)]


@c.handle_errors
def compare_command(
    config: c.ConfigArg = None,
    variants: PatternsOpt = None,
    exclude: ExcludeOpt = None,
    baseline: BaselineOpt = None,
    device: c.DeviceOpt = None,
    dtype: c.DtypeOpt = None,
    batch: c.BatchOpt = None,
    heads: c.HeadsOpt = None,
    kv_heads: c.KvHeadsOpt = None,
    seq: c.SeqOpt = None,
    head_dim: c.HeadDimOpt = None,
    causal: c.CausalOpt = None,
    output_dir: c.OutputDirOpt = None,
    region: c.RegionOpt = None,
    seed: c.SeedOpt = None,
    wait: c.WaitOpt = None,
    warmup: c.WarmupOpt = None,
    active: c.ActiveOpt = None,
    timing: c.TimingOpt = True,
    min_time: c.MinTimeOpt = 0.25,
    cuda_graph: c.CudaGraphOpt = False,
    flush_l2: c.FlushL2Opt = False,
    check_masking: c.MaskingOpt = False,
    refresh_ceiling: c.RefreshCeilingOpt = False,
    clocks: c.ClocksOpt = True,
    fmt: c.FormatOpt = c.OutputFormat.table,
) -> None:
    """Profile every selected variant at every configured shape and compare them."""
    from attnprof.profiling.inputs import resolve_device
    from attnprof.profiling.session import plan_cells, select_variants

    if variants and exclude is None:
        exclude = []  # an explicit selection replaces the config's include and exclude lists together
    cfg = build_config(config, variants=variants or None, exclude=exclude, baseline=baseline, device=device,
                       dtype=dtype, causal=causal, output_dir=output_dir, region=region, seed=seed,
                       shape=dict(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, head_dim=head_dim),
                       schedule=dict(wait=wait, warmup=warmup, active=active))
    loaded = c.load_variants_for_cli()
    for line in c.plugin_notes(loaded):
        c.note(line)
    chosen = select_variants(cfg, loaded.registry)
    if cfg.baseline and cfg.baseline not in [v.name for v in chosen]:
        c.note(f"baseline {cfg.baseline!r} is not among the selected variants: no speed-ups")
    resolved = resolve_device(cfg.device)
    outcome = execute("compare", cfg, plan_cells(cfg, chosen, resolved), resolved,
                      Measure(timing, min_time, cuda_graph, flush_l2, check_masking, refresh_ceiling, clocks), fmt)
    _print(outcome, fmt, cfg.baseline)
    raise typer.Exit(exit_code(outcome))


def _print(outcome, fmt: c.OutputFormat, baseline: str | None) -> None:  # noqa: ANN001
    from attnprof.report.export import to_json
    from attnprof.report.tables import glance_table, shape_table

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    entries = outcome.document["results"]
    heading = "###" if fmt is c.OutputFormat.markdown else "=="
    for shape in dict.fromkeys(e["shape"] for e in entries):
        rows = [e for e in entries if e["shape"] == shape]
        first = rows[0]
        title = f"{shape} {first['dtype']} {'causal' if first['causal'] else 'full'} on {first['device']}"
        if baseline:
            title += f", speed-up vs {baseline}"
        c.emit(f"\n{heading} {title}\n")
        c.emit(shape_table(rows, fmt.value))
    c.emit(f"\n{heading} at a glance\n")
    c.emit(glance_table(entries, fmt.value))
    c.note(f"results: {outcome.files[0]} and {outcome.files[1].name}; traces in {outcome.files[0].parent}")
