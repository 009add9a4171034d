"""Validation errors in words: one line per problem (`shapes.0.seq: must be > 0 (got 0)`, an unknown key
with its close matches, `--seq must be > 0` for a field typed as an option), and `validate_mapping`, which
checks a mapping against a model and raises them as a ConfigError. Pydantic only; no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from attnprof.errors import ConfigError

SchemaT = TypeVar("SchemaT", bound=BaseModel)

#: Where the user typed a field, by its path without list indices (`shapes.0.seq` is ("shapes", "seq")):
#: e.g. {("shapes", "seq"): "--seq"}. "" names a check of several fields at that path (`heads must be a
#: multiple of kv_heads`), said in its own words.
FieldNames = Mapping[tuple[str, ...], str]


def close_matches(word: str, choices: Any, n: int = 3) -> list[str]:
    """The `n` choices nearest to `word` (difflib's ratio, at least 0.6), nearest first."""
    from difflib import get_close_matches

    return get_close_matches(word, [str(c) for c in choices], n=n, cutoff=0.6)


def did_you_mean(word: str, choices: Any) -> str:
    """`; did you mean causal?` (or `a or b?`) for the nearest choices to `word`; "" without any."""
    near = close_matches(word, choices)
    if not near:
        return ""
    return "; did you mean " + (near[0] if len(near) == 1 else ", ".join(near[:-1]) + " or " + near[-1]) + "?"


def _model_at(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the last part of `loc` (a field path from `schema`), or None."""
    from typing import get_args

    model: Any = schema
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        found, todo = None, [field.annotation]
        while todo and found is None:  # unwrap Optional, list[...], Annotated[...] to the model inside
            kind = todo.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found = kind
            else:
                todo += list(get_args(kind))
        if found is None:
            return None
        model = found
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unknown_key(schema: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """`unknown key`, with the nearest keys of the mapping it is in (`; did you mean causal?`)."""
    model = _model_at(schema, loc) if schema is not None and loc else None
    if model is None or not isinstance(loc[-1], str):
        return "unknown key"
    return "unknown key" + did_you_mean(loc[-1], model.model_fields)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _shown(value: Any) -> str:
    """A value as the user typed it: numbers without a trailing `.0`, text quoted."""
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return repr(value)


def _as_typed(item: Any) -> str:
    """A problem in words for a value the user typed: `must be > 0 (got 0)`."""
    kind, ctx, given = item["type"], item.get("ctx") or {}, item.get("input")
    if kind in _BOUNDS:
        sign = _BOUNDS[kind]
        bound = ctx.get({">": "gt", ">=": "ge", "<": "lt", "<=": "le"}[sign])
        text = f"must be {sign} {_shown(bound).strip(chr(39))}"
    elif kind == "literal_error":
        text = f"must be {ctx.get('expected')}"
    else:
        text = item["msg"].removeprefix("Value error, ")
    return f"{text} (got {_shown(given)})" if isinstance(given, (int, float, str)) and given != "" else text


def format_validation_error(
    error: ValidationError, schema: type[BaseModel] | None = None, names: FieldNames | None = None
) -> list[str]:
    """One line per problem, in the order pydantic found them: `field.path: message`, an unknown key with
    the nearest keys of its mapping (`schema`: the model validated), or for a field in `names` (what the
    user typed, e.g. an option) `--seq must be > 0 (got 0)`."""
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        typed = (names or {}).get(tuple(part for part in loc if isinstance(part, str)))
        if typed is not None and item["type"] != "extra_forbidden":
            text = _as_typed(item) if typed else item["msg"].removeprefix("Value error, ")
            lines.append(text if not typed else f"{typed} {text}" if text.startswith("must") else f"{typed}: {text}")
            continue
        path = ".".join(str(part) for part in loc) or "(config)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = _unknown_key(schema, loc)
        lines.append(f"{path}: {message}")
    return lines


def validate_mapping(schema: type[SchemaT], data: Any, origin: str, names: FieldNames | None = None) -> SchemaT:
    """Validate a mapping into `schema` (a pydantic model); ConfigError carries `field.path: message` lines,
    or when every problem is in a field the user typed (`names`, see `FieldNames`), those lines alone
    (`--seq must be > 0 (got 0)`)."""
    if data is None:
        raise ConfigError(f"{origin}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, origin, schema, names) from None


def validation_error(
    error: ValidationError, origin: str, schema: type[BaseModel] | None = None, names: FieldNames | None = None
) -> ConfigError:
    """The ConfigError of a failed validation (see `validate_mapping`)."""
    lines = format_validation_error(error, schema, names)
    typed = [
        item
        for item in error.errors()
        if item["type"] != "extra_forbidden" and tuple(p for p in item["loc"] if isinstance(p, str)) in (names or {})
    ]
    if names and len(typed) == len(lines):
        return ConfigError("\n".join(lines))
    return ConfigError(f"{origin} is invalid:\n" + "\n".join(f"  {line}" for line in lines))
