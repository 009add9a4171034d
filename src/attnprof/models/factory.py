"""Any model: `factory: package.module:fn`, a callable that returns `(model, example_inputs)`.

The factory is called with the keywords it accepts among `batch`, `seq`, `device`, `dtype` (a torch
dtype) and `attn_implementation` (all of them when it takes `**kwargs`). `example_inputs` is a tensor, a
tuple or list of positional arguments, or a dict of keyword arguments; the model is called with them.
attnprof then moves the model to the device and dtype, and the inputs to the device (floating-point
inputs to the dtype too), unless the factory took `device` and `dtype` itself.

attnprof swaps the attention implementation only where the model exposes a way to: the factory takes
`attn_implementation`, or the model has `set_attn_implementation` (transformers models do). Otherwise
the model is profiled as it is built, in one row per seq and mode named `as-built`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from attnprof.errors import ConfigError, VariantFailure, VariantUnavailableError, one_line
from attnprof.models.built import AttentionShape, BuiltModel, model_step

FACTORY_KEYWORDS = ("batch", "seq", "device", "dtype", "attn_implementation")
AS_BUILT = "as-built"  # the implementation name of a model whose attention cannot be swapped


def load_factory(path: str) -> Callable[..., Any]:
    """The callable `package.module:fn` names; ConfigError (exit 2, one line) when the module cannot be
    imported, lacks the name, or the name is not callable."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised while importing
        raise ConfigError(f"factory {path}: cannot import {module_name}: {one_line(exc)}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ConfigError(f"factory {path}: module {module_name} has no {attr!r}")
    if not callable(factory):
        raise ConfigError(f"factory {path}: {attr!r} is a {type(factory).__name__}, not a callable")
    return factory


def accepted_keywords(factory: Callable[..., Any]) -> set[str]:
    """The keywords of FACTORY_KEYWORDS that `factory` takes (all of them with `**kwargs`)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable without a signature
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return set(FACTORY_KEYWORDS)
    return {p.name for p in params if p.name in FACTORY_KEYWORDS and p.kind is not inspect.Parameter.POSITIONAL_ONLY}


def build_factory_model(
    factory: Callable[..., Any],
    attn_implementation: str | None,
    batch: int,
    seq: int | None,
    device: str,
    dtype: str,
    mode: str,
) -> BuiltModel:
    """Call the factory (see the module docstring), set the attention implementation where the model
    allows it, move model and inputs, and return the model with its step. VariantFailure (a failed row)
    when the factory raises or returns something other than `(model, example_inputs)`."""
    from attnprof.profiling.inputs import torch_dtype

    takes = accepted_keywords(factory)
    offered = {"batch": batch, "seq": seq, "device": device, "dtype": torch_dtype(dtype)}
    kwargs = {key: value for key, value in offered.items() if key in takes and value is not None}
    if attn_implementation is not None and "attn_implementation" in takes:
        kwargs["attn_implementation"] = attn_implementation
    try:
        made = factory(**kwargs)
    except Exception as exc:
        raise VariantFailure(f"the factory raised {one_line(exc)}") from None
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        raise VariantFailure(f"the factory returned {type(made).__name__}, not (model, example_inputs)")
    model, inputs = made
    if not callable(model) or not hasattr(model, "parameters"):
        raise VariantFailure(f"the factory's model is a {type(model).__name__}, not a torch.nn.Module")
    if attn_implementation is not None and "attn_implementation" not in takes:
        _set_implementation(model, attn_implementation)
    if not {"device", "dtype"} <= takes:
        model = model.to(device=device, dtype=torch_dtype(dtype))
        inputs = _moved(inputs, device, torch_dtype(dtype))
    model.eval()

    def call(with_loss: bool) -> Any:
        if isinstance(inputs, dict):
            return model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return model(*inputs)
        return model(inputs)

    return BuiltModel(model, seq if "seq" in takes else None, AttentionShape(), model_step(model, call, mode))


def _set_implementation(model: Any, name: str) -> None:
    """`model.set_attn_implementation(name)`, checked: a model that refuses, or silently keeps its own,
    is VariantUnavailableError (a skipped row)."""
    try:
        model.set_attn_implementation(name)
    except Exception as exc:
        raise VariantUnavailableError(f"the model rejects attn_implementation={name}: {one_line(exc)}") from None
    kept = getattr(getattr(model, "config", None), "_attn_implementation", name)
    if kept != name:
        raise VariantUnavailableError(f"the model keeps attn_implementation={kept} (it cannot switch to {name})")


def _moved(inputs: Any, device: str, dtype: Any) -> Any:
    """`inputs` with every tensor on `device`, floating-point ones in `dtype`; containers rebuilt."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(device=device, dtype=dtype) if inputs.is_floating_point() else inputs.to(device)
    if isinstance(inputs, dict):
        return {key: _moved(value, device, dtype) for key, value in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_moved(value, device, dtype) for value in inputs)
    return inputs
