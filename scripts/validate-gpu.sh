#!/usr/bin/env bash
# Validate attnprof on a CUDA GPU: the GPU tests, then the overhead and fidelity benchmarks, with a
# markdown summary (date, GPU, torch, test counts, key figures) in OUT_DIR/summary.md.
#
# Usage, from a checkout where attnprof and its test extra are installed (this script installs nothing):
#   scripts/validate-gpu.sh [OUT_DIR]          default OUT_DIR: attnprof-out/validate-gpu-<UTC date and time>
#   FIDELITY_MODES="fwd bwd" scripts/validate-gpu.sh   also time the backward against do_bench (about 1 min more)
#   PARTS="tests" scripts/validate-gpu.sh OUT_DIR; PARTS="plugins bench" scripts/validate-gpu.sh OUT_DIR
#       runs it in pieces into one OUT_DIR (default PARTS: "tests plugins bench"); the summary covers what is there
# Takes about 13 minutes on an H200 with pytest-xdist installed (the plugins' tests in parallel), 20 without. Exits with pytest's status when the tests fail, 2 without a CUDA GPU,
# and non-zero when a benchmark fails; once the tests have run, the summary is written in every case.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/attnprof-out/validate-gpu-$(date -u +%Y%m%d-%H%M%S)}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$root"
py="${PYTHON:-python3}"

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "validate-gpu.sh: no CUDA GPU visible to torch ($("$py" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)); run it on a machine with one" >&2
    exit 2
fi
mkdir -p "$out"

# tests/ runs in one process (its timing tests need a quiet GPU); the plugins' tests mostly compile Triton
# kernels, which pytest-xdist spreads over the CPU cores when it is installed (8 workers: 226 s instead of >540 s).
plugin_tests=(plugins/attnprof-triton/tests plugins/attnprof-flash-attn/tests)
parallel=()
if "$py" -c 'import xdist' 2>/dev/null; then parallel=(-n "${PLUGIN_WORKERS:-8}"); fi
parts=" ${PARTS:-tests plugins bench} "
tests=0
set +e
if [[ $parts == *" tests "* ]]; then
    "$py" -m pytest -m gpu -q -rs -p no:cacheprovider tests 2>&1 | tee "$out/pytest-gpu-tests.txt"
    tests=${PIPESTATUS[0]}
fi
if [[ $parts == *" plugins "* ]]; then
    "$py" -m pytest -m gpu -q -rs -p no:cacheprovider "${parallel[@]}" "${plugin_tests[@]}" 2>&1 \
        | tee "$out/pytest-gpu-plugins.txt"
    rc=${PIPESTATUS[0]}
    if [ "$tests" -eq 0 ]; then tests=$rc; fi
fi
set -e

bench=0
if [[ $parts == *" bench "* ]]; then
    "$py" benchmarks/overhead.py --out "$out/overhead.json" 2>&1 | tee "$out/overhead.md" || bench=$?
    for mode in ${FIDELITY_MODES:-fwd}; do
        "$py" benchmarks/fidelity.py --mode "$mode" --out "$out/fidelity-$mode.json" 2>&1 \
            | tee "$out/fidelity-$mode.md" || bench=$?
    done
fi

"$py" - "$out" "$tests" <<'EOF' > "$out/summary.md"
import json, re, sys, time
from pathlib import Path

import torch

out, tests_rc = Path(sys.argv[1]), int(sys.argv[2])
print(f"# attnprof on a GPU, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
print(f"- GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__} (CUDA {torch.version.cuda})")
for name in ("tests", "plugins"):
    path = out / f"pytest-gpu-{name}.txt"
    if not path.exists():
        print(f"- `python -m pytest -m gpu` over {name}: not run in this directory")
        continue
    counts = [line for line in path.read_text().splitlines() if re.match(r"=*\s*\d+ \w+.* in [0-9.]+s", line)]
    print(f"- `python -m pytest -m gpu` over {name}: {counts[-1].strip('= ') if counts else 'no summary line'}")
print(f"- pytest exit status of this invocation: {tests_rc}")
try:
    o = json.loads((out / "overhead.json").read_text())
    print(f"- `benchmarks/overhead.py` ({o['spec']['shape']} {o['spec']['dtype']}, {o['rounds']} rounds): attnprof "
          f"{o['attnprof_total_s']:.3f} s, raw loop {o['raw_total_s']:.3f} s: {o['ratio_end_to_end']:.3f}x "
          f"(target <= {o['target_ratio']}x)")
except (OSError, KeyError, TypeError, ValueError) as exc:
    print(f"- `benchmarks/overhead.py`: no result ({exc})")
for path in sorted(out.glob("fidelity-*.json")):
    f = json.loads(path.read_text())
    ok = [r for r in f["rows"] if r.get("status") == "ok"]
    keys = ("diff_graph_vs_graph_pct", "diff_flush_vs_do_bench_pct")
    gaps = [abs(r[k]) for r in ok for k in keys if r.get(k) is not None]
    within = sum(bool(r["within_5pct"]) for r in ok)
    largest = f"{max(gaps):.1f}%" if gaps else "n/a"
    print(f"- `benchmarks/fidelity.py --mode {f['mode']}`: {within} of {len(ok)} cells within 5% of the "
          f"independent timers, largest gap {largest}")
EOF
cat "$out/summary.md"
echo "validate-gpu.sh: results in $out" >&2
if [ "$tests" -ne 0 ]; then exit "$tests"; fi
exit "$bench"
