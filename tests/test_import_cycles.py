"""attnprof's modules import one another without a cycle, counting imports inside functions and
under TYPE_CHECKING too: a cycle, even a lazy one, means the cut between modules is wrong."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "attnprof"


def module_names() -> dict[str, Path]:
    names = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(module: str, name: str | None, modules: dict[str, Path]) -> str | None:
    """The attnprof module an import names: `pkg.sub` when `name` is a submodule, else `module`."""
    if name is not None and f"{module}.{name}" in modules:
        return f"{module}.{name}"
    return module if module in modules else None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every attnprof module that `module` imports anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    target = _resolve(alias.name, None, modules)
                    if target:
                        found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                target = _resolve(source, alias.name, modules)
                if target:
                    found.add(target)
    found.discard(module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_import_cycles_in_attnprof():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_through_the_pipeline_or_the_cli():
    """The engine's layers on their own: every module but analysis/ (which sits below both and never imports
    them), so a cycle found here runs through pipeline/, cli/ or what they stand on."""
    graph = {
        name: {target for target in targets if not target.startswith("attnprof.analysis")}
        for name, targets in import_graph().items()
        if not name.startswith("attnprof.analysis")
    }
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_walker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    modules = {"attnprof.a": tmp_path / "a.py", "attnprof.b": tmp_path / "b.py", "attnprof.pkg.c": tmp_path / "c.py"}
    modules["attnprof.a"].write_text("def f():\n    from attnprof import b\n")
    modules["attnprof.b"].write_text("from .pkg.c import thing\n")
    modules["attnprof.pkg.c"].write_text("import typing\nif typing.TYPE_CHECKING:\n    from attnprof.a import f\n")
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"attnprof.a": {"attnprof.b"}, "attnprof.b": {"attnprof.pkg.c"}, "attnprof.pkg.c": {"attnprof.a"}}
    assert find_cycle(graph) == ["attnprof.a", "attnprof.b", "attnprof.pkg.c", "attnprof.a"]


def package_of(module: str) -> str:
    """The subpackage a module belongs to, for package-level edges: `attnprof.analysis.counters` for
    `attnprof.analysis.counters.cell`, `attnprof.pipeline` for `attnprof.pipeline.rows`, and a top-level
    module (`attnprof.config`) as itself."""
    modules = module_names()
    path = modules[module]
    parts = module.split(".")
    return module if path.name == "__init__.py" or len(parts) == 2 else ".".join(parts[:-1])


def package_graph() -> dict[str, set[str]]:
    """The import graph between packages: an edge for every import from a module of one package into another."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = package_of(module)
        edges = graph.setdefault(source, set())
        for target in targets:
            if (package := package_of(target)) != source and not source.startswith(package + "."):
                edges.add(package)
    return graph


def test_no_import_cycles_between_packages():
    """Module-level acyclicity is not enough: two packages importing each other (analysis/counters and
    analysis/findings, say) are one package cut in the wrong place. A package may import its own parent's
    `__init__`-free modules below it, never a sibling that imports it back."""
    cycle = find_cycle(package_graph())
    assert cycle is None, "package import cycle: " + " -> ".join(cycle or [])


#: Which layers a layer may never import (dependencies point one way: cli -> pipeline, report -> results ->
#: profiling / analysis -> registry / config -> errors).
FORBIDDEN = {
    "attnprof.pipeline": ("attnprof.report", "attnprof.cli"),
    "attnprof.report": ("attnprof.pipeline", "attnprof.cli"),
    "attnprof.results": ("attnprof.pipeline", "attnprof.report", "attnprof.cli"),
    "attnprof.analysis": ("attnprof.results", "attnprof.pipeline", "attnprof.report", "attnprof.cli"),
    "attnprof.profiling": ("attnprof.analysis", "attnprof.report", "attnprof.results", "attnprof.pipeline"),
}


def test_layers_import_only_downwards():
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for layer, banned in FORBIDDEN.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_package_graph_sees_a_cycle_between_subpackages(monkeypatch):
    graph = {"attnprof.analysis.counters": {"attnprof.analysis.findings"}, "attnprof.analysis.findings": set()}
    assert find_cycle(graph) is None
    graph["attnprof.analysis.findings"].add("attnprof.analysis.counters")
    counters, findings = "attnprof.analysis.counters", "attnprof.analysis.findings"
    assert find_cycle(graph) == [counters, findings, counters]
