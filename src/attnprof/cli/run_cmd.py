"""`attnprof run`: profile one variant and print what its trace shows."""

from __future__ import annotations

from typing import Annotated

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import Measure, execute, exit_code
from attnprof.cli.settings import build_config
from attnprof.errors import VariantUnavailableError

VariantOpt = Annotated[str, typer.Option("--variant", "-v", help="The variant to profile (see `attnprof list`).")]


@c.handle_errors
def run_command(
    variant: VariantOpt,
    config: c.ConfigOpt = None,
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
    """Profile one variant with torch.profiler and print its per-forward facts."""
    from attnprof.profiling.inputs import resolve_device
    from attnprof.profiling.session import plan_cells

    cfg = build_config(config, device=device, dtype=dtype, causal=causal, output_dir=output_dir, region=region,
                       seed=seed, shape=dict(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, head_dim=head_dim),
                       schedule=dict(wait=wait, warmup=warmup, active=active))
    loaded = c.load_variants_for_cli()
    chosen = loaded.registry.get(variant)
    resolved = resolve_device(cfg.device)
    cells = plan_cells(cfg, [chosen], resolved)
    _refuse_unavailable(chosen, cells[0][1], loaded.registry)
    outcome = execute("run", cfg, cells, resolved, Measure(timing, min_time, cuda_graph, flush_l2, check_masking, refresh_ceiling, clocks), fmt)
    _print(outcome, fmt)
    code = exit_code(outcome)
    failed = [r for r in outcome.results if r.status == "failed"]
    if failed:
        c.fail(f"{failed[0].variant} failed: {failed[0].reason}", code=code)
    raise typer.Exit(code)


def _refuse_unavailable(variant, spec, registry) -> None:  # noqa: ANN001
    reason = variant.unavailable_reason(spec)
    if reason is None:
        return
    runnable = [v.name for v in registry.all() if v.unavailable_reason(spec) is None]
    where = f"{spec.device} with {spec.dtype} at {spec.shape_label}"
    raise VariantUnavailableError(f"{variant.name} cannot run on {where}: {reason}",
                                  hint=f"variants that can run here: {', '.join(runnable) or 'none'}")


def _print(outcome, fmt: c.OutputFormat) -> None:  # noqa: ANN001
    from attnprof.report.analysis_tables import render_analysis_dict
    from attnprof.report.export import to_json
    from attnprof.report.tables import run_summary_table

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    style = fmt.value
    for result, entry in zip(outcome.results, outcome.document["results"]):
        c.emit(run_summary_table(entry, style))
        if result.analysis:
            c.emit("")
            c.emit(render_analysis_dict(result.analysis, style))
        if result.key_averages_table:
            c.emit("\ntorch.profiler key_averages (all profiled steps; the region's CPU and GPU rows are separate):")
            c.emit(result.key_averages_table if style == "table" else f"```\n{result.key_averages_table}\n```")
    c.note(f"results: {outcome.files[0]} and {outcome.files[1].name}")
