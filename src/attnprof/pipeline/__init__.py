"""The pipeline: wires profiling (measure), analysis (analyse) and report (write) into cells and runs.

`run_cell` runs one variant at one spec; `run_cells` a list of them with the SM clock sampled;
`open_run_folder` makes an invocation's own folder. A whole job (`run`, `compare`, `check`, `sweep`, resumed
or under torchrun) runs through `pipeline.engine.run_job`.
"""

from attnprof.pipeline.cell import run_cell
from attnprof.pipeline.run import (
    RunFolder,
    RunOutcome,
    attach_clocks,
    cell_specs,
    check_baseline,
    check_names,
    config_exclusions,
    ensure_output_dir,
    open_run_folder,
    plan_cells,
    resolve_config,
    run_cells,
    select_variants,
    without_collective,
    without_unrunnable_wildcards,
)

__all__ = [
    "RunFolder",
    "RunOutcome",
    "attach_clocks",
    "cell_specs",
    "check_baseline",
    "check_names",
    "config_exclusions",
    "ensure_output_dir",
    "open_run_folder",
    "plan_cells",
    "resolve_config",
    "run_cell",
    "run_cells",
    "select_variants",
    "without_collective",
    "without_unrunnable_wildcards",
]
