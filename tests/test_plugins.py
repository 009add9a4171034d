"""The plugin loader, through real entry points.

Each test writes small distributions into a temporary site directory (a `*.dist-info`
folder with METADATA and entry_points.txt, beside the plugin's module files), puts it on
sys.path, and loads the registry as the CLI does. importlib.metadata finds them there
exactly as it finds pip-installed packages.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from attnprof import RunSpec, Variant
from attnprof import plugins as plugins_mod
from attnprof.plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, load_variants

SPEC = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=16, head_dim=8)
_serial = itertools.count()

GOOD_PLUGIN = '''
import _attnprof_probe as probe
from attnprof import Variant

probe.imports[__name__] = probe.imports.get(__name__, 0) + 1


def _forward(q, k, v, causal, state):
    return q


def register_variants(register):
    probe.registers[__name__] = probe.registers.get(__name__, 0) + 1
    for name in VARIANT_NAMES:
        register(Variant(name=name, description="a test variant", forward=_forward))
'''


class Site:
    """A temporary site directory on sys.path that holds fake installed plugins."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.monkeypatch = monkeypatch
        self.tag = f"t{next(_serial)}"  # module names unique to this test: sys.modules outlives it
        (path / "_attnprof_probe.py").write_text("imports = {}\nregisters = {}\n")
        monkeypatch.delitem(sys.modules, "_attnprof_probe", raising=False)
        monkeypatch.syspath_prepend(str(path))

    def module_name(self, stem: str) -> str:
        return f"ap_{stem}_{self.tag}"

    def add(self, dist: str, version: str = "1.0", *, entry: str | None = None, target: str | None = None,
            source: str | None = None, variants: tuple[str, ...] = ()) -> str:
        """Install distribution `dist` with one entry point; returns the plugin's module name.

        Without `source` the module is GOOD_PLUGIN registering `variants`; `target`
        defaults to the module itself.
        """
        module = self.module_name(dist.replace("-", "_"))
        code = source if source is not None else f"VARIANT_NAMES = {list(variants)!r}\n" + GOOD_PLUGIN
        (self.path / f"{module}.py").write_text(textwrap.dedent(code))
        info = self.path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(
            f"[{ENTRY_POINT_GROUP}]\n{entry or dist} = {target or module}\n"
        )
        (info / "top_level.txt").write_text(module + "\n")
        self.monkeypatch.delitem(sys.modules, module, raising=False)
        import importlib

        importlib.invalidate_caches()
        return module

    @property
    def probe(self):
        import _attnprof_probe

        return _attnprof_probe


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # No ATTNPROF_PLUGINS, and no registry loaded before this test (the CLI in test_plugin_cli.py loads
    # without refresh=True); afterwards the fake plugins are forgotten again.
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    plugins_mod.forget_loaded_variants()
    (tmp_path / "site").mkdir()
    yield Site(tmp_path / "site", monkeypatch)
    plugins_mod.forget_loaded_variants()


def _status(loaded, entry: str):
    matches = [p for p in loaded.plugins if p.entry_point == entry]
    assert len(matches) == 1, [p.entry_point for p in loaded.plugins]
    return matches[0]


def _builtin_names() -> list[str]:
    return list(load_variants(no_plugins=True, refresh=True).registry.names())


# --- discovery ------------------------------------------------------------------------


def test_discovers_a_plugin_with_its_package_and_version(site):
    site.add("attnprof-demo", "2.3.1", entry="demo", variants=("demo-a", "demo-b"))
    loaded = load_variants(refresh=True)
    status = _status(loaded, "demo")
    assert status.ok and status.error is None
    assert status.package == "attnprof-demo 2.3.1"
    assert status.variants == ["demo-a", "demo-b"]
    for name in ("demo-a", "demo-b"):
        variant = loaded.registry.get(name)
        assert variant.source == "attnprof-demo 2.3.1"
        assert variant.unavailable_reason(SPEC) is None


def test_entry_point_may_name_the_function(site):
    site.add("attnprof-fn", entry="fn", variants=("fn-variant",))
    module = site.module_name("attnprof_fn")
    site.add("attnprof-fnref", entry="fnref", source="""
        from attnprof import Variant

        def hook(register):
            register(Variant(name="fnref-variant", description="", forward=lambda *a: None))
    """)
    # point the second distribution's entry point at its function rather than its module
    info = site.path / "attnprof_fnref-1.0.dist-info" / "entry_points.txt"
    info.write_text(f"[{ENTRY_POINT_GROUP}]\nfnref = {site.module_name('attnprof_fnref')}:hook\n")
    loaded = load_variants(refresh=True)
    assert _status(loaded, "fn").variants == ["fn-variant"] and module in sys.modules
    assert _status(loaded, "fnref").variants == ["fnref-variant"]


def test_register_accepts_keyword_fields(site):
    site.add("attnprof-kw", entry="kw", source='''
        from attnprof import Variant

        def register_variants(register):
            made = register(name="kw-variant", description="built from fields", forward=lambda q, k, v, c, s: q,
                            devices=("cpu",), layout="bshd")
            assert isinstance(made, Variant)
    ''')
    variant = load_variants(refresh=True).registry.get("kw-variant")
    assert variant.layout == "bshd" and variant.devices == ("cpu",)
    assert variant.source == "attnprof-kw 1.0"


def test_builtins_load_alongside_plugins(site):
    builtins = _builtin_names()
    assert builtins, "no built-in variants registered"
    site.add("attnprof-demo", entry="demo", variants=("demo-a",))
    loaded = load_variants(refresh=True)
    assert set(builtins) <= set(loaded.registry.names())
    assert loaded.plugins[0].package == "built-in"  # built-ins first
    assert all(loaded.registry.get(n).source == "built-in" for n in builtins)


# --- selection ------------------------------------------------------------------------


@pytest.fixture
def two_plugins(site):
    site.add("attnprof-one", entry="one", variants=("one-v",))
    site.add("attnprof-two", entry="two", variants=("two-v",))
    return site


@pytest.mark.parametrize("selector", ["one", "attnprof-one"], ids=["entry-point", "distribution"])
def test_env_selects_one_plugin(two_plugins, monkeypatch, selector):
    monkeypatch.setenv(PLUGINS_ENV, selector)
    loaded = load_variants(refresh=True)
    names = loaded.registry.names()
    assert "one-v" in names and "two-v" not in names
    assert [p.entry_point for p in loaded.plugins if p.package != "built-in"] == ["one"]
    assert set(_builtin_names()) <= set(names)


def test_env_lists_several_plugins(two_plugins, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, " one , two,")
    assert {"one-v", "two-v"} <= set(load_variants(refresh=True).registry.names())


def test_empty_env_loads_no_third_party_plugins(two_plugins, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "")
    loaded = load_variants(refresh=True)
    assert all(p.package == "built-in" for p in loaded.plugins)
    assert loaded.registry.names() == _builtin_names()
    assert two_plugins.probe.imports == {}  # not even imported


def test_unset_env_loads_every_plugin(two_plugins):
    assert {"one-v", "two-v"} <= set(load_variants(refresh=True).registry.names())


def test_explicit_enabled_overrides_env(two_plugins, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "one")
    names = load_variants(enabled={"two"}, refresh=True).registry.names()
    assert "two-v" in names and "one-v" not in names


def test_no_plugins_keeps_only_builtins(two_plugins, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "one,two")  # --no-plugins wins over the environment
    loaded = load_variants(no_plugins=True, refresh=True)
    assert [p.package for p in loaded.plugins] == ["built-in"]
    assert "one-v" not in loaded.registry and "two-v" not in loaded.registry
    assert two_plugins.probe.imports == {}


# --- isolation: a broken plugin is reported and harms nothing else --------------------


BROKEN = {
    "import": ("import this_module_does_not_exist_anywhere\n",
               "plugin failed to import: ModuleNotFoundError: No module named 'this_module_does_not_exist_anywhere'"),
    "syntax": ("def register_variants(register:\n", "plugin failed to import: SyntaxError: "),
    "raises": ("def register_variants(register):\n    raise RuntimeError('no GPU driver\\nsecond line')\n",
               "plugin failed in register_variants: RuntimeError: no GPU driver"),
    "no-hook": ("VALUE = 1\n", "has no register_variants(register) function"),
    "bad-variant": ("from attnprof import Variant\n"
                    "def register_variants(register):\n"
                    "    register(Variant(name='Bad Name', description='', forward=None))\n",
                    "plugin failed in register_variants: ValueError: variant name 'Bad Name'"),
    "not-a-variant": ("def register_variants(register):\n    register(object())\n",
                      "plugin failed in register_variants: TypeError: register() takes an attnprof Variant"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_plugin_is_reported_and_isolated(site, kind):
    source, expected = BROKEN[kind]
    site.add("attnprof-good", entry="good", variants=("good-v",))
    site.add(f"attnprof-broken-{kind}", "0.4", entry=f"broken-{kind}", source=source)
    loaded = load_variants(refresh=True)  # never raises

    status = _status(loaded, f"broken-{kind}")
    assert not status.ok and status.variants == []
    assert status.package == f"attnprof-broken-{kind} 0.4"
    assert expected in status.error
    assert "\n" not in status.error  # one line
    assert status in loaded.problems

    # shown as an unavailable placeholder under the entry point's name, with the reason
    placeholder = loaded.registry.get(f"broken-{kind}")
    assert placeholder.source == f"attnprof-broken-{kind} 0.4"
    assert placeholder.unavailable_reason(SPEC) == status.error
    with pytest.raises(RuntimeError):
        placeholder.forward(None, None, None, True, None)

    # everything else is untouched
    assert _status(loaded, "good").ok
    assert loaded.registry.get("good-v").unavailable_reason(SPEC) is None
    assert set(_builtin_names()) <= set(loaded.registry.names())
    assert [p.entry_point for p in loaded.problems] == [f"broken-{kind}"]


def test_entry_point_to_a_missing_attribute(site):
    module = site.add("attnprof-good", entry="good", variants=("good-v",))
    site.add("attnprof-typo", entry="typo", target=f"{module}:register_variant", source="")
    loaded = load_variants(refresh=True)
    status = _status(loaded, "typo")
    assert status.error.startswith("plugin failed to import: AttributeError")
    assert loaded.registry.get("typo").unavailable_reason(SPEC) == status.error
    assert "good-v" in loaded.registry


def test_duplicate_of_a_builtin_is_reported(site):
    builtin = _builtin_names()[0]  # e.g. "naive"
    site.add("attnprof-dup", "1.2", entry="dup", variants=(builtin, "dup-own"))
    loaded = load_variants(refresh=True)
    status = _status(loaded, "dup")
    assert not status.ok
    assert status.error == f"variant {builtin!r} from attnprof-dup 1.2 is already registered by built-in"
    assert status.variants == ["dup-own"]  # its other variants still load
    assert loaded.registry.get(builtin).source == "built-in"  # the built-in keeps its name
    assert loaded.registry.get("dup-own").source == "attnprof-dup 1.2"
    clash = loaded.registry.get(f"{builtin}-dup")  # the losing variant, shown as unavailable
    assert clash.unavailable_reason(SPEC) == status.error and clash.source == "attnprof-dup 1.2"


def test_duplicate_between_plugins_first_one_wins(site):
    site.add("attnprof-alpha", entry="alpha", variants=("shared-name",))
    site.add("attnprof-beta", entry="beta", variants=("shared-name", "beta-own"))
    loaded = load_variants(refresh=True)  # entry points load in name order
    assert _status(loaded, "alpha").ok
    beta = _status(loaded, "beta")
    assert beta.error == "variant 'shared-name' from attnprof-beta 1.0 is already registered by attnprof-alpha 1.0"
    assert loaded.registry.get("shared-name").source == "attnprof-alpha 1.0"
    assert "beta-own" in loaded.registry


def test_register_variants_failing_midway_registers_nothing(site):
    site.add("attnprof-half", entry="half", source='''
        from attnprof import Variant

        def register_variants(register):
            register(Variant(name="half-first", description="", forward=lambda *a: None))
            raise ImportError("optional dependency missing")
    ''')
    loaded = load_variants(refresh=True)
    assert "half-first" not in loaded.registry
    assert _status(loaded, "half").error == ("plugin failed in register_variants: "
                                             "ImportError: optional dependency missing")


def test_check_that_raises_becomes_a_reason(site):
    site.add("attnprof-checky", entry="checky", source='''
        from attnprof import Variant

        def check(spec):
            raise KeyError("head_dim")

        def register_variants(register):
            register(Variant(name="checky", description="", forward=lambda *a: None, check=check))
    ''')
    variant = load_variants(refresh=True).registry.get("checky")
    assert variant.unavailable_reason(SPEC) == "check raised KeyError: 'head_dim'"


# --- lazy, and once -------------------------------------------------------------------


def test_plugins_load_lazily_and_once(site):
    module = site.add("attnprof-counted", entry="counted", variants=("counted-v",))
    probe = site.probe
    assert module not in sys.modules and probe.imports == {}  # nothing imported before the first load

    first = load_variants()
    assert module in sys.modules
    assert probe.imports == {module: 1} and probe.registers == {module: 1}

    second = load_variants()
    assert second is first  # the cached object
    assert probe.imports == {module: 1} and probe.registers == {module: 1}

    third = load_variants(refresh=True)
    assert third is not first
    assert probe.registers == {module: 2}  # refresh registers again (the module stays imported)
    assert probe.imports == {module: 1}


def test_each_selection_is_cached_separately(two_plugins):
    everything = load_variants()
    builtins_only = load_variants(no_plugins=True)
    assert builtins_only is not everything
    assert load_variants(no_plugins=True) is builtins_only
    assert load_variants() is everything
    assert load_variants(enabled={"one"}) is not everything


def test_public_api_is_importable():
    import attnprof

    assert attnprof.Variant is Variant and attnprof.RunSpec is RunSpec
    assert set(attnprof.__all__) >= {"Variant", "RunSpec"}


@pytest.mark.parametrize(("entry", "expected"),
                         [("Naive", None), ("_private", "private"), ("plugin.v2", "plugin.v2"),
                          ("Ünïcode", "n-code")])
def test_broken_plugin_with_an_awkward_entry_point_name(site, entry, expected):
    # The placeholder's name is derived from the entry point's; it must neither clash with
    # a variant already registered nor be an invalid name, and loading must never raise.
    if entry == "Naive" and "naive" not in _builtin_names():
        pytest.skip("needs the built-in variant naive")
    site.add("attnprof-awkward", entry=entry, source="raise RuntimeError('boom')\n")
    site.add("attnprof-good", entry="good", variants=("good-v",))
    loaded = load_variants(refresh=True)
    status = _status(loaded, entry)
    assert status.error == "plugin failed to import: RuntimeError: boom"
    assert "good-v" in loaded.registry
    assert loaded.registry.get("naive" if "naive" in _builtin_names() else "good-v").load_error is None
    placeholders = [v for v in loaded.registry.all() if v.load_error]
    if entry == "Naive":  # the name is taken: no placeholder, the status still tells
        assert placeholders == [] and status in loaded.problems
    else:
        assert [(v.name, v.source) for v in placeholders] == [(expected, "attnprof-awkward 1.0")]
        assert placeholders[0].unavailable_reason(SPEC) == status.error
