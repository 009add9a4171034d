"""Variant discovery through the `attnprof.variants` entry-point group.

Built-ins and third-party plugins take the same path: an entry point names a module
holding `register_variants(register)`, or that function itself. Loading happens once,
lazily, and a broken plugin is recorded rather than raised.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from attnprof.errors import AttnprofError, one_line
from attnprof.registry import Variant
from attnprof.variant_registry import Registry

ENTRY_POINT_GROUP = "attnprof.variants"
PLUGINS_ENV = "ATTNPROF_PLUGINS"
BUILTIN_ENTRY_POINT = "builtin"
BUILTIN_TARGET = "attnprof.variants:register_variants"


@dataclass
class PluginStatus:
    """What one entry point contributed, or why it contributed nothing."""

    entry_point: str
    package: str
    variants: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the plugin loaded and registered without a problem."""
        return self.error is None


@dataclass
class LoadedVariants:
    """The registry plus a status line for every entry point that was considered."""

    registry: Registry
    plugins: list[PluginStatus]

    @property
    def problems(self) -> list[PluginStatus]:
        """Plugins that failed in any way."""
        return [p for p in self.plugins if not p.ok]


_cache: dict[tuple, LoadedVariants] = {}

#: The variants of the optional plugin packages shipped in plugins/, by name: (entry point, distribution). A
#: config may name them on a machine without the plugin (`with_absent_plugins`).
OPTIONAL_PLUGIN_VARIANTS: dict[str, tuple[str, str]] = {
    "flash-attn": ("flash-attn", "attnprof-flash-attn"),
    "triton-flash": ("triton", "attnprof-triton"),
    "triton-flash-fp8": ("triton", "attnprof-triton"),
    "cudnn-fe": ("cudnn-frontend", "attnprof-cudnn-frontend"),
    "cudnn-fe-fp8": ("cudnn-frontend", "attnprof-cudnn-frontend"),
}


def forget_loaded_variants() -> None:
    """Drop every cached registry, so the next `load_variants` reads the entry points again."""
    _cache.clear()


def enabled_plugins_from_env() -> set[str] | None:
    """The plugin names ATTNPROF_PLUGINS allows, or None when it is unset (all load)."""
    raw = os.environ.get(PLUGINS_ENV)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def load_variants(
    no_plugins: bool = False, enabled: set[str] | None = None, *, refresh: bool = False
) -> LoadedVariants:
    """Build the registry from the entry points, once per selection.

    `no_plugins` keeps only the built-ins; `enabled` (default: from ATTNPROF_PLUGINS)
    limits third-party plugins to those entry-point or distribution names.
    """
    if enabled is None:
        enabled = enabled_plugins_from_env()
    key = (no_plugins, None if enabled is None else frozenset(enabled))
    if not refresh and key in _cache:
        return _cache[key]
    registry = Registry()
    statuses: list[PluginStatus] = []
    points = _entry_points()
    if not any(_is_builtin(ep) for ep in points):
        # Running from a source tree without an install: take the built-ins by the same function.
        points.insert(0, metadata.EntryPoint(BUILTIN_ENTRY_POINT, BUILTIN_TARGET, ENTRY_POINT_GROUP))
    for ep in points:
        builtin = _is_builtin(ep)
        if not builtin:
            if no_plugins:
                continue
            if enabled is not None and ep.name not in enabled and _package_name(ep) not in enabled:
                continue
        statuses.append(_load_one(ep, registry, builtin))
    loaded = LoadedVariants(registry, statuses)
    _cache[key] = loaded
    return loaded


def with_absent_plugins(loaded: LoadedVariants) -> Registry:
    """`loaded`'s registry plus a stand-in for each optional plugin variant (`OPTIONAL_PLUGIN_VARIANTS`) it
    lacks, so that a shipped config naming one runs the rest: its cells are skipped, "plugin not installed
    (attnprof-flash-attn)" (or "not loaded" where --no-plugins or ATTNPROF_PLUGINS left an installed one out),
    or fail with the plugin's error when it is installed but broken. A wildcard never chooses a stand-in
    (`Registry.matching`), and a typo still fails, its close matches including these names."""
    absent = [name for name in OPTIONAL_PLUGIN_VARIANTS if name not in loaded.registry]
    if not absent:
        return loaded.registry
    registry = Registry()
    for variant in loaded.registry.all():
        registry.register(variant)
    installed = {ep.name for ep in _entry_points()}
    for name in absent:
        entry, package = OPTIONAL_PLUGIN_VARIANTS[name]
        status = next((p for p in loaded.plugins if p.entry_point == entry), None)
        broken = status.error if status is not None else None
        if broken is not None:
            missing = None
        elif status is not None:
            missing = f"plugin {package} loaded without a {name} variant"
        elif entry in installed:
            missing = f"plugin {package} not loaded (--no-plugins or ATTNPROF_PLUGINS)"
        else:
            missing = f"plugin not installed ({package})"
        registry.register(
            Variant(
                name=name,
                description=f"(from the optional plugin {package})",
                forward=_never,
                source=package,
                load_error=broken,
                not_installed=missing,
            )
        )
    return registry


def _entry_points() -> list[metadata.EntryPoint]:
    seen: set[tuple[str, str]] = set()
    points = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        ident = (ep.name, ep.value)
        if ident not in seen:  # an editable install can expose one dist twice
            seen.add(ident)
            points.append(ep)
    return sorted(points, key=lambda ep: (not _is_builtin(ep), ep.name))


def _is_builtin(ep: metadata.EntryPoint) -> bool:
    return ep.value.replace(" ", "") == BUILTIN_TARGET


def _package_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else ep.name


def _source(ep: metadata.EntryPoint, builtin: bool) -> str:
    if builtin:
        return "built-in"
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.name
    return f"{dist.name} {dist.version}"


def _load_one(ep: metadata.EntryPoint, registry: Registry, builtin: bool) -> PluginStatus:
    source = _source(ep, builtin)
    status = PluginStatus(entry_point=ep.name, package=source)
    try:
        target = ep.load()
    except Exception as exc:
        status.error = f"plugin failed to import: {one_line(exc)}"
        _placeholder(registry, ep.name, source, status.error)
        return status
    register_fn = getattr(target, "register_variants", None) if isinstance(target, types.ModuleType) else target
    if not callable(register_fn):
        status.error = f"plugin entry point {ep.value!r} has no register_variants(register) function"
        _placeholder(registry, ep.name, source, status.error)
        return status
    staged: list[Variant] = []
    try:
        register_fn(_make_register(staged, source))
    except Exception as exc:
        status.error = f"plugin failed in register_variants: {one_line(exc)}"
        _placeholder(registry, ep.name, source, status.error)
        return status
    problems = []
    for variant in staged:
        try:
            registry.register(variant)
            status.variants.append(variant.name)
        except AttnprofError as exc:
            problems.append(exc.message)
            # the loser of a name clash stays visible: unavailable in `list`, a failed row in `compare`
            _placeholder(registry, f"{variant.name}@{ep.name}", source, exc.message)
    if problems:
        status.error = "; ".join(problems)
    return status


def _make_register(staged: list[Variant], source: str) -> Callable[..., Variant]:
    def register(variant: Variant | None = None, **fields: Any) -> Variant:
        """Register a Variant, or build one from keyword fields (name, description, forward, ...)."""
        if variant is None:
            variant = Variant(**fields)
        elif fields:
            raise TypeError("register() takes a Variant or keyword fields, not both")
        if not isinstance(variant, Variant):
            raise TypeError(f"register() takes an attnprof Variant, got {type(variant).__name__}")
        variant.source = source
        staged.append(variant)
        return variant

    return register


def _placeholder(registry: Registry, name: str, source: str, error: str) -> None:
    """A stand-in so `list` shows the broken plugin as an unavailable entry.

    Skipped when its name is taken (the status still carries the error); never raises.
    """
    safe = _safe_name(name)
    if safe in registry:
        return
    try:
        registry.register(
            Variant(name=safe, description="(plugin did not load)", forward=_never, source=source, load_error=error)
        )
    except (AttnprofError, ValueError):
        pass


def _safe_name(name: str) -> str:
    """The entry-point name made a valid variant name: lower-case ASCII, digits and `._+-`."""
    cleaned = re.sub(r"[^a-z0-9._+-]+", "-", name.lower()).strip("._+-")
    return cleaned or "plugin"


def _never(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("this plugin did not load")
