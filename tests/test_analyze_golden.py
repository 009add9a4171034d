"""`attnprof analyze --format json` on every trace in tests/data (`*.json.gz`), byte for byte against what the
analysis wrote when the golden file was made: one plain JSON file per trace in tests/data/golden/, named after the
trace's path under tests/data (`/` becomes `__`, `.json.gz` is dropped: `h200/masks/is-causal.json.gz` ->
`h200__masks__is-causal.json`). Each file is exactly what `attnprof analyze TRACE --format json` prints (no
--region): the analysis's JSON document, indented by 2, its keys in the order the analysis writes them, with a
trailing newline; or, for a trace the analysis refuses, the JSON string "error: MESSAGE". A change that only makes
the analysis faster must not move a single character; a failure names the case and the keys that differ.

A change meant to change the output (a new field, a fixed figure) regenerates the files from the repository root,
and its review reads the diff of tests/data/golden/:

    PYTHONPATH=src python tests/test_analyze_golden.py --update

(`PYTHONPATH=src` is for a checkout attnprof is not installed from; it writes every file, removes those of traces
that are gone, and says which changed.) See tests/data/golden/README.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from attnprof.analysis import analyze_trace
from attnprof.errors import AttnprofError
from attnprof.results.files import to_json
from attnprof.results.records import analysis_record

ROOT = Path(__file__).parent
DATA = ROOT / "data"
GOLDEN_DIR = DATA / "golden"
UPDATE = "PYTHONPATH=src python tests/test_analyze_golden.py --update"
TRACES = sorted(p.relative_to(ROOT).as_posix() for p in DATA.rglob("*.json.gz"))


def case_name(trace: str) -> str:
    """The golden file's name (less `.json`) for a trace path relative to tests/: its path under tests/data,
    `.json.gz` dropped, `/` as `__`, any character but letters, digits and `.+-_` as `_`."""
    stem = trace.removeprefix("data/").removesuffix(".json.gz")
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", stem.replace("/", "__"))


#: case name -> trace path relative to tests/
CASES = {case_name(trace): trace for trace in TRACES}


def golden_path(case: str) -> Path:
    return GOLDEN_DIR / f"{case}.json"


def document(trace: str) -> str:
    """What `attnprof analyze TRACE --format json` prints (no --region), or "error: MESSAGE"."""
    try:
        return to_json(analysis_record(analyze_trace(ROOT / trace)))
    except AttnprofError as exc:
        return f"error: {exc.message}"


def golden_text(trace: str) -> str:
    """The golden file's text for `trace`: what the CLI prints (the document and a newline); an error as a JSON
    string."""
    doc = document(trace)
    return (json.dumps(doc) if doc.startswith("error: ") else doc) + "\n"


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def differences(golden: Any, actual: Any, path: str = "") -> list[str]:
    """Where `actual` differs from `golden`: one line per differing key or item (`kernels[3].time_us: ...`),
    values compared as JSON text (so 1 and 1.0 differ), and the order of a dict's keys."""
    where = path or "(document)"
    if isinstance(golden, dict) and isinstance(actual, dict):
        lines = [f"{_key(path, k)}: gone (golden: {_show(v)})" for k, v in golden.items() if k not in actual]
        lines += [f"{_key(path, k)}: new, {_show(v)}" for k, v in actual.items() if k not in golden]
        for key in golden:
            if key in actual:
                lines += differences(golden[key], actual[key], _key(path, key))
        shared = [key for key in actual if key in golden]
        if not lines and shared != [key for key in golden if key in actual]:
            lines.append(f"{where}: keys in another order: {shared}")
        return lines
    if isinstance(golden, list) and isinstance(actual, list):
        lines = [] if len(golden) == len(actual) else [f"{where}: {len(actual)} items (golden: {len(golden)})"]
        for i, (old, new) in enumerate(zip(golden, actual, strict=False)):
            lines += differences(old, new, f"{path}[{i}]")
        return lines
    if json.dumps(golden) != json.dumps(actual):
        return [f"{where}: {_show(actual)} (golden: {_show(golden)})"]
    return []


def mismatch(case: str, expected: str, actual: str, shown: int = 25) -> str:
    """The failure message for a case whose analysis is not its golden file's text."""
    head = f"{case}: `attnprof analyze {CASES[case]}` is not {golden_path(case).relative_to(ROOT.parent)}"
    try:
        lines = differences(json.loads(expected), json.loads(actual))
    except ValueError as exc:
        lines = [f"the golden file is not JSON ({exc})"]
    if not lines:
        lines = ["the same values, written differently (the file is not what --update writes)"]
    more = [f"... and {len(lines) - shown} more"] if len(lines) > shown else []
    tail = f"If the change is intended, regenerate: {UPDATE}, and review the diff."
    return "\n".join([head, *("  " + line for line in lines[:shown] + more), tail])


def test_every_trace_has_a_golden_document():
    assert len(CASES) == len(TRACES), "two traces map to one golden file name: rename one (see case_name)"
    present = {p.name.removesuffix(".json") for p in GOLDEN_DIR.glob("*.json")}
    missing, stale = sorted(set(CASES) - present), sorted(present - set(CASES))
    assert not missing and not stale, (
        f"traces without a golden file: {missing}; golden files without a trace: {stale}; regenerate: {UPDATE}"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_analysis_is_unchanged(case: str):
    path = golden_path(case)
    assert path.exists(), f"{case}: no golden file {path.name} for {CASES[case]}; regenerate: {UPDATE}"
    expected = path.read_text(encoding="utf-8")
    actual = golden_text(CASES[case])
    if actual != expected:
        pytest.fail(mismatch(case, expected, actual), pytrace=False)


def test_cli_prints_the_golden_document(cli):
    trace = "data/h200/training/fwd+bwd/8x16x1024x64/sdpa-flash.json.gz"
    result = cli("analyze", str(ROOT / trace), "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stdout == golden_path(case_name(trace)).read_text(encoding="utf-8")


def update() -> None:
    """Write every case's golden file and remove those of traces that are gone; say what changed."""
    if len(CASES) != len(TRACES):
        sys.exit("two traces map to one golden file name: rename one (see case_name)")
    GOLDEN_DIR.mkdir(exist_ok=True)
    changed = []
    for case, trace in CASES.items():
        path, text = golden_path(case), golden_text(trace)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
            changed.append(case)
    stale = [p for p in sorted(GOLDEN_DIR.glob("*.json")) if p.name.removesuffix(".json") not in CASES]
    for p in stale:
        p.unlink()
    print(f"{GOLDEN_DIR.relative_to(ROOT.parent)}: {len(CASES)} cases, {len(changed)} written, {len(stale)} removed")
    for case in changed:
        print(f"  wrote {case}.json")
    for p in stale:
        print(f"  removed {p.name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    update()
