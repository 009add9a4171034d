"""Loading a config: YAML read with `yaml.safe_load` (the built-in default or a file), validated into a
`Config`, and command-line overrides applied. No torch."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from attnprof.config.messages import FieldNames, validate_mapping
from attnprof.config.models import Config
from attnprof.errors import ConfigError


def parse_config(data: Any, origin: str = "config", names: FieldNames | None = None) -> Config:
    """Validate a mapping into a Config; ConfigError carries `field.path: message` lines (see
    `validate_mapping` for `names`)."""
    return validate_mapping(Config, data, origin, names)


def read_yaml(path: str | Path) -> Any:
    """The YAML document in `path`, read with `yaml.safe_load`; ConfigError (one line) when the file is
    missing, unreadable or not valid YAML."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    return _parse_yaml(text, str(path))


def _parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML{yaml_problem(exc)}") from None


def yaml_problem(exc: Exception) -> str:
    """Where and what a YAML error found: ` (line 3, column 1): expected ',' or '}', but got '<stream end>'`
    (the line and column where the parser saw the problem, else where the construct it was reading began)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {problem}"


def load_config(path: str | Path | None = None) -> Config:
    """Read a YAML config with `yaml.safe_load`; None loads the built-in default config."""
    if path is None:
        text = resources.files("attnprof").joinpath("default.yaml").read_text()
        return parse_config(_parse_yaml(text, "built-in default config"), "built-in default config")
    return parse_config(read_yaml(path), str(path))


def apply_overrides(config: Config, names: FieldNames | None = None, **overrides: Any) -> Config:
    """A copy of `config` with the non-None overrides applied and validated again; `names` says where the
    user typed each overridden field (see `FieldNames`), for the errors."""
    data = config.model_dump()
    changed = {key: value for key, value in overrides.items() if value is not None}
    if not changed:
        return config
    data.update(changed)
    return parse_config(data, "command-line options", names)
