"""The findings registry: one object per finding, the ids and everything that lists them derived from
it (FINDING_IDS, `attnprof findings`, docs/findings.md, the ids `check` accepts)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import msgspec
import pytest
from test_import_cycles import find_cycle, import_graph

from attnprof.analysis import FINDING_IDS
from attnprof.analysis.findings import FINDINGS, SEVERITIES, Finding, FindingContext, FindingRegistry, Rule
from attnprof.analysis.findings.registry import NoImpact
from attnprof.errors import DuplicateFindingError, ExpectationsError, UnknownFindingError
from attnprof.report.expectations import parse_expectations
from attnprof.report.findings_tables import REGENERATE
from attnprof.results.records import finding_record

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnprof" / "analysis" / "findings"
DOC = ROOT / "docs" / "findings.md"
INFO = {
    "bandwidth-bound",
    "single-fused-kernel",
    "low-occupancy-by-design",
    "occupancy-unreported",
    "metadata-transposes",
    "bwd-dot-do-o",
    "bwd-dq-convert",
    "bwd-memsets",
    "stall-dominated",
}


def _rule(finding_id: str = "some-finding", severity: str = "problem", **more) -> Rule:
    fields = {"summary": "A summary.", "paragraph": "What it means.", "evidence": lambda ctx: None} | more
    return Rule(finding_id, severity, **fields)


def _context() -> FindingContext:
    return FindingContext(per_forward=[], kernels=[], dtype=None, dtype_source=None, cpu_time_us=0.0, gpu_time_us=None)


# ---------------------------------------------------------------- the registry


def test_finding_ids_are_the_registry_ids_in_order():
    assert FINDING_IDS == tuple(rule.id for rule in FINDINGS) == FINDINGS.ids()
    assert len(set(FINDING_IDS)) == len(FINDING_IDS) == len(FINDINGS)


@pytest.mark.parametrize("rule", list(FINDINGS), ids=lambda rule: rule.id)
def test_every_finding_has_a_summary_a_paragraph_and_a_severity(rule: Rule):
    assert rule.severity in SEVERITIES == ("problem", "info")
    assert rule.summary.endswith(".") and "\n" not in rule.summary and len(rule.summary) <= 120
    assert len(rule.paragraph) >= 300 and "\n" not in rule.paragraph and "  " not in rule.paragraph
    assert rule.paragraph.endswith(".")
    assert FINDINGS.get(rule.id) is rule and rule.id in FINDINGS


def test_the_severities():
    assert {rule.id for rule in FINDINGS if rule.severity == "info"} == INFO


def test_a_duplicate_id_raises():
    registry = FindingRegistry([_rule("a-finding")])
    with pytest.raises(DuplicateFindingError, match="'a-finding' is already registered"):
        registry.register(_rule("a-finding", "info"))
    with pytest.raises(DuplicateFindingError):
        FindingRegistry([*FINDINGS, _rule("gpu-idle")])
    assert registry.ids() == ("a-finding",)


def test_a_rule_is_checked_when_made():
    with pytest.raises(ValueError, match="severity must be one of problem, info"):
        _rule(severity="warning")
    with pytest.raises(ValueError, match="lower-case words"):
        _rule("Hidden_Memcpy")
    with pytest.raises(ValueError, match="one non-empty line"):
        _rule(summary="two\nlines")
    with pytest.raises(ValueError, match="paragraph is empty"):
        _rule(paragraph=" ")


def test_only_a_problem_has_an_impact_and_it_says_what_it_counts():
    def counted(ctx: FindingContext) -> float | None:
        """The time it costs."""
        return 5.0

    assert _rule(impact=counted).impact_text == "The time it costs."
    with pytest.raises(ValueError, match="only a problem has an impact"):
        _rule(severity="info", impact=counted)
    with pytest.raises(ValueError, match="its docstring says what it counts"):
        _rule(impact=lambda ctx: 1.0)
    problems = [rule for rule in FINDINGS if rule.severity == "problem"]
    assert all(rule.impact is not None and rule.impact_text.endswith(".") for rule in problems)


@pytest.mark.parametrize("cost, expected, reason", [
    (25.0, (25.0, 12.5), None), (-3.0, (0.0, 0.0), None), (NoImpact("needs-peaks"), (None, None), "needs-peaks"),
])
def test_a_match_carries_the_severity_the_impact_and_its_share_of_the_instance(cost, expected, reason):
    def counted(ctx: FindingContext) -> float | NoImpact:
        """The time it costs."""
        return cost

    rule = _rule(evidence=lambda ctx: "said.", impact=counted)
    ctx = FindingContext(per_forward=[], kernels=[], dtype=None, dtype_source=None, cpu_time_us=150.0,
                         gpu_time_us=200.0)  # the instance's time: the larger, 200 us
    found = rule.match(ctx)
    assert (found.severity, found.impact_us, found.impact_pct, found.no_impact_reason) == ("problem", *expected, reason)
    assert msgspec.to_builtins(finding_record(found)) == {
        "id": "some-finding", "message": "said.", "severity": "problem",
        "impact_us": expected[0], "impact_pct": expected[1], "evidence": {}, "no_impact_reason": reason,
    }


def test_an_unknown_id_gets_the_closest():
    with pytest.raises(UnknownFindingError, match=r"unknown finding 'gpu-idl'; did you mean gpu-idle") as caught:
        FINDINGS.get("gpu-idl")
    assert caught.value.exit_code == 2 and caught.value.hint
    with pytest.raises(UnknownFindingError, match=r"^unknown finding 'xyzzy'$"):
        FINDINGS.get("xyzzy")


def test_the_decorator_registers_one_object_whose_match_wraps_the_sentence():
    registry = FindingRegistry()

    @registry.rule("two-lines", severity="info", summary="Two.", paragraph="\n    First line,\n    second line.\n")
    def two(ctx: FindingContext) -> str | None:
        return f"{ctx.unit} said."

    assert isinstance(two, Rule) and list(registry) == [two]
    assert two.paragraph == "First line, second line."
    assert two.match(_context()) == Finding("two-lines", "forward said.", "info")
    assert registry.build(_context()) == [Finding("two-lines", "forward said.", "info")]
    assert _rule().match(_context()) is None and FINDINGS.build(_context()) == []


def test_the_package_has_no_import_cycle():
    graph = {name: deps for name, deps in import_graph().items() if name.startswith("attnprof.analysis.findings")}
    assert find_cycle(graph) is None


def test_each_themed_module_imports_only_the_base_of_the_findings():
    """The themed modules hold the rules and import only the registry; the judge (the stage above them, which
    runs the counter and occupancy rules on a row) and its attainable rule (which reads the calls memory-bound
    names) import the registry and themed modules, never the package."""
    themed = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "registry", "judge", "attainable"}
    for path in PACKAGE.glob("*.py"):
        if path.stem in ("__init__", "registry"):
            continue
        imported = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnprof.analysis.findings")
        }
        if path.stem in ("judge", "attainable"):
            allowed = {f"attnprof.analysis.findings.{name}" for name in themed | {"registry", "attainable"}}
            assert "attnprof.analysis.findings.registry" in imported and imported <= allowed, path.name
        else:
            assert imported == {"attnprof.analysis.findings.registry"}, path.name


# ---------------------------------------------------------------- check accepts exactly the registry's ids


def test_check_accepts_every_registry_id_and_nothing_else():
    declared = parse_expectations({"*": {"findings": {"has": list(FINDING_IDS)}}}, Path("e.yaml"))
    assert [e.value for e in declared.items] == list(FINDING_IDS)
    with pytest.raises(ExpectationsError, match="unknown finding gpu-idl; did you mean gpu-idle") as info:
        parse_expectations({"*": {"findings": {"lacks": ["gpu-idl"]}}}, Path("e.yaml"))
    assert info.value.hint == f"attnprof findings lists all {len(FINDING_IDS)}"


# ---------------------------------------------------------------- attnprof findings


def test_the_command_lists_every_finding_in_order(cli):
    result = cli("findings", "--wide")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["id", "severity", "summary"]
    rows = [line.split(None, 2) for line in lines[2:]]
    assert [row[:2] for row in rows] == [[rule.id, rule.severity] for rule in FINDINGS]
    assert [row[2] for row in rows] == [rule.summary for rule in FINDINGS]


def test_the_command_fits_the_width(cli):
    result = cli("findings", env={"COLUMNS": "80"})
    assert result.exit_code == 0 and max(map(len, result.output.splitlines())) <= 80


def test_the_command_prints_one_finding_in_full(cli):
    result = cli("findings", "gpu-idle", "--wide")
    assert result.exit_code == 0, result.output
    rule = FINDINGS.get("gpu-idle")
    assert "gpu-idle" in result.output and "problem" in result.output and rule.summary in result.output
    assert rule.paragraph in result.output


def test_an_unknown_id_is_one_line_and_exit_2(cli):
    result = cli("findings", "host-snyc")
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == "error: unknown finding 'host-snyc'; did you mean host-sync?"
    assert "Traceback" not in result.output


def test_json(cli):
    listed = cli("findings", "--format", "json")
    assert listed.exit_code == 0
    assert json.loads(listed.output) == {"findings": [rule.to_dict() for rule in FINDINGS]}
    one = json.loads(cli("findings", "cpu-bound", "-f", "json").output)
    rule = FINDINGS.get("cpu-bound")
    assert one == {"id": "cpu-bound", "severity": "problem", "summary": rule.summary} | {
        "paragraph": rule.paragraph, "impact": rule.impact_text
    }
    assert "less the GPU's busy time" in one["impact"]
    assert json.loads(cli("findings", "single-fused-kernel", "-f", "json").output)["impact"] is None
    wrong = cli("findings", "cpu-bund", "-f", "json")
    assert wrong.exit_code == 2 and json.loads(wrong.stdout)["error"].startswith("unknown finding 'cpu-bund'")


def test_markdown_of_one_finding(cli):
    result = cli("findings", "hidden-memcpy", "--format", "markdown")
    rule = FINDINGS.get("hidden-memcpy")
    assert result.output == (
        f"## hidden-memcpy\n\n**problem**: {rule.summary}\n\n{rule.paragraph}\n\n**Impact**: {rule.impact_text}\n"
    )


def test_docs_findings_md_is_generated_from_the_registry(cli):
    generated = cli("findings", "--format", "markdown").output
    assert all(f"## {rule.id}\n" in generated and rule.paragraph in generated for rule in FINDINGS)
    assert DOC.read_text(encoding="utf-8") == generated, f"docs/findings.md is stale: run `{REGENERATE}`"
