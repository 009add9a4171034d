"""attnprof's start-up: wall time of fresh processes next to a bare interpreter, and no torch.

Each command runs `--runs` times in a new process (cold interpreter, warm file cache), in
turn, so a slow moment of the machine touches every command alike. Reported: median, IQR
(p25-p75), min and max, and the median above `python -c pass`. A separate run of each command
under `python -X importtime` says whether torch was imported and what took longest.

Target (issue #6): `attnprof --help` under 0.3 s above the bare interpreter; `--help` and
`list --no-plugins` never import torch.

Usage (from the repo root, attnprof installed):
    python3 benchmarks/startup.py [--runs 15] [--out startup.json]
Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attnprof.stats import quantile

TARGET_ABOVE_PASS_S = 0.3


def entry_script() -> list[str]:
    """How to start the `attnprof` console script with this interpreter, bypassing shims (pyenv)."""
    beside = Path(sys.executable).parent / "attnprof"
    found = beside if beside.exists() else (shutil.which("attnprof") and Path(shutil.which("attnprof")))
    if found:
        with open(found, "rb") as fh:
            if fh.read(2) == b"#!" and b"python" in fh.readline():
                return [sys.executable, str(found)]
    return [sys.executable, "-m", "attnprof"]


def commands() -> dict[str, list[str]]:
    """The timed commands, by label."""
    script = entry_script()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "attnprof --help": script + ["--help"],
        "attnprof --no-plugins list": script + ["--no-plugins", "list"],
        "python -m attnprof --help": [sys.executable, "-m", "attnprof", "--help"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }


def run_once(argv: list[str]) -> float:
    """Wall seconds of one run; output discarded; a failure raises."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def import_report(argv: list[str]) -> dict[str, Any]:
    """Whether torch gets imported, how many modules, and the slowest top-level imports (ms)."""
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=False)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        rows.append((name.rstrip(), int(cumulative)))
    top = [(n.strip(), us / 1e3) for n, us in rows if not n.startswith("  ")]
    top.sort(key=lambda r: -r[1])
    return {"imports_torch": any(n.strip() == "torch" for n, _ in rows), "modules": len(rows),
            "slowest_top_level_ms": [[n, round(ms, 1)] for n, ms in top[:6]]}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    """The results as a markdown table."""
    base = results["python -c pass"]["median_s"]
    lines = ["| command | median s | above `python -c pass` s | IQR s | min s | max s | imports torch |",
             "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        above = "" if label == "python -c pass" else f"{r['median_s'] - base:+.3f}"
        torch_col = "yes" if r["imports_torch"] else "no"
        lines.append(f"| `{label}` | {r['median_s']:.3f} | {above} | {r['iqr_s']:.3f} | {r['min_s']:.3f} | "
                     f"{r['max_s']:.3f} | {torch_col} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Time every command; 0 when the targets hold, 1 when one is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--skip-torch", action="store_true", help="do not time `import torch` for reference")
    args = parser.parse_args(argv)

    cmds = commands()
    if args.skip_torch:
        cmds.pop("python -c 'import torch'")
    env_note = {k: os.environ.get(k) for k in ("ATTNPROF_PLUGINS", "TYPER_USE_RICH") if os.environ.get(k)}
    cache = None
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        # An environment that writes no bytecode (our sandbox) would make every run compile attnprof from
        # source, which an installed attnprof never does: the children get a bytecode cache instead.
        cache = tempfile.TemporaryDirectory(prefix="attnprof-pycache-")
        os.environ["PYTHONPYCACHEPREFIX"] = env_note["bytecode_cache"] = cache.name
    for argv_ in cmds.values():  # one untimed run each: bytecode caches written, files in the page cache
        run_once(argv_)
    times: dict[str, list[float]] = {label: [] for label in cmds}
    for _ in range(args.runs):
        for label, argv_ in cmds.items():
            times[label].append(run_once(argv_))
    results: dict[str, dict[str, Any]] = {}
    for label, argv_ in cmds.items():
        t = times[label]
        results[label] = {"argv": argv_, "runs": len(t), "median_s": quantile(t, 0.5),
                          "iqr_s": quantile(t, 0.75) - quantile(t, 0.25), "min_s": min(t), "max_s": max(t),
                          "times_s": [round(x, 4) for x in t], **import_report(argv_)}
    base = results["python -c pass"]["median_s"]
    help_above = results["attnprof --help"]["median_s"] - base
    checks = {
        "help_above_pass_s": round(help_above, 4),
        "help_under_target": help_above < TARGET_ABOVE_PASS_S,
        "help_imports_torch": results["attnprof --help"]["imports_torch"],
        "list_imports_torch": results["attnprof --no-plugins list"]["imports_torch"],
    }
    document = {"benchmark": "startup", "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                            "cpus": os.cpu_count()}, "env": env_note, "results": results, "checks": checks}
    if args.out:
        args.out.write_text(json.dumps(document, indent=2))
    for label, r in results.items():
        if label != "python -c pass":
            print(f"{label}: slowest top-level imports (ms): {r['slowest_top_level_ms']}", file=sys.stderr)
    print(f"\n`attnprof --help` is {help_above:.3f} s above `python -c pass` "
          f"(target < {TARGET_ABOVE_PASS_S} s: {'met' if checks['help_under_target'] else 'MISSED'}); "
          f"torch imported by --help: {checks['help_imports_torch']}, by list --no-plugins: "
          f"{checks['list_imports_torch']}\n")
    print(markdown(results))
    ok = checks["help_under_target"] and not checks["help_imports_torch"] and not checks["list_imports_torch"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
