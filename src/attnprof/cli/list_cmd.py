"""`attnprof list`: every variant, whether it runs here, and why not."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from attnprof.cli.common import (
    ConfigArg,
    ConfigOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    OutputFormat,
    WideOpt,
    config_path,
    emit,
    handle_errors,
    load_variants_for_cli,
    note,
    plugin_notes,
    table_width,
)
from attnprof.cli.settings import build_config

if TYPE_CHECKING:
    from attnprof.config import Config
    from attnprof.registry import RunSpec


@handle_errors
def list_command(
    config: ConfigArg = None,
    config_file: ConfigOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """List every variant, whether it can run here, and if not, why not."""
    from attnprof.report.tables import variant_list_table

    cfg = build_config(config_path(config, config_file), device=device, dtype=dtype)
    loaded = load_variants_for_cli()
    spec = _probe_spec(cfg)
    entries = []
    for variant in loaded.registry.all():
        reason = variant.unavailable_reason(spec)
        entries.append(
            {
                "name": variant.name,
                "available": reason is None,
                "reason": reason,
                "source": variant.source,
                "description": variant.description,
            }
        )
    if fmt is OutputFormat.json:
        emit(
            json.dumps(
                {
                    "device": spec.device,
                    "dtype": spec.dtype,
                    "shape": spec.shape_label,
                    "variants": entries,
                    "plugin_problems": [
                        {"package": p.package, "entry_point": p.entry_point, "error": p.error} for p in loaded.problems
                    ],
                },
                indent=2,
            )
        )
        return
    emit(f"variants on {spec.device}, {spec.dtype}, {spec.shape_label}:")
    emit(variant_list_table(entries, fmt.value, table_width(fmt, wide)))
    for line in plugin_notes(loaded):
        note(line)


def _probe_spec(cfg: "Config") -> "RunSpec":
    """The first configured shape on the resolved device, with the dtype resolved for it. The device
    and dtype are resolved without importing torch (attnprof.devices), and the built-in variants'
    checks do not import it either."""
    from attnprof.devices import resolve_device
    from attnprof.pipeline import cell_specs, resolve_config

    device = resolve_device(cfg.device)
    return cell_specs(resolve_config(cfg, device), device)[0]
