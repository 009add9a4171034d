"""Config file plus command-line overrides, validated together."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnprof.config import Config


def build_config(
    source: Path | Config | None,
    *,
    shape: dict[str, Any] | None = None,
    schedule: dict[str, Any] | None = None,
    **overrides: Any,
) -> "Config":
    """Load `source` (a path, a Config already loaded, or None for the built-in default) and apply the
    options the user gave.

    Any shape option replaces the config's shapes with one shape: the first configured
    shape with those fields changed. An error in a value the user gave names its option
    (`--seq must be > 0 (got 0)`).
    """
    from attnprof.config import Config, apply_overrides, load_config

    config = source if isinstance(source, Config) else load_config(source)
    changes = {k: v for k, v in overrides.items() if v is not None}
    shape = {k: v for k, v in (shape or {}).items() if v is not None}
    if shape:
        first = config.shapes[0].model_dump()
        first.update(shape)
        if "heads" in shape and "kv_heads" not in shape:
            first["kv_heads"] = None
        changes["shapes"] = [first]
    schedule = {k: v for k, v in (schedule or {}).items() if v is not None}
    if schedule:
        changes["schedule"] = config.schedule.model_dump() | schedule
    if "output_dir" in changes:
        changes["output_dir"] = str(changes["output_dir"])
    return apply_overrides(config, option_names(changes, shape, schedule), **changes)


#: The option of each config field a command-line option sets, where its name differs from `--field`.
_OPTIONS = {"modes": "--mode", "output_dir": "--output-dir", "causal": "--causal/--no-causal"}


def option_names(
    changes: dict[str, Any], shape: dict[str, Any], schedule: dict[str, Any]
) -> dict[tuple[str, ...], str]:
    """Where the user typed each changed config field (`config.FieldNames`): its option."""

    def flag(field: str) -> str:
        return _OPTIONS.get(field, "--" + field.replace("_", "-"))

    names: dict[tuple[str, ...], str] = {
        (field,): flag(field) for field in changes if field not in ("shapes", "schedule")
    }
    names |= {("shapes", field): flag(field) for field in shape}
    names |= {("schedule", field): flag(field) for field in schedule}
    if shape:
        names[("shapes",)] = ""  # a check of several shape fields (heads and kv_heads) says which
    if "exclude" in changes:
        names[("exclude", "variants")] = "--exclude"
    return names
