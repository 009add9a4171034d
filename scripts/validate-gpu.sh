#!/usr/bin/env bash
# Validate attnprof on a CUDA GPU: the GPU tests, then the overhead and fidelity benchmarks, with a
# markdown summary (date, GPU, torch, test counts, key figures) in OUT_DIR/summary.md.
#
# Usage, from a checkout where attnprof and its test extra are installed (this script installs nothing):
#   scripts/validate-gpu.sh [OUT_DIR]          default OUT_DIR: attnprof-out/validate-gpu-<UTC date and time>
#   FIDELITY_MODES="fwd bwd" scripts/validate-gpu.sh   also time the backward against do_bench (about 1 min more)
# Takes about 7-9 minutes on an H200. Exits with pytest's status when the tests fail, 2 without a CUDA GPU,
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

tests=0
"$py" -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.txt" || tests=$?

bench=0
"$py" benchmarks/overhead.py --out "$out/overhead.json" 2>&1 | tee "$out/overhead.md" || bench=$?
for mode in ${FIDELITY_MODES:-fwd}; do
    "$py" benchmarks/fidelity.py --mode "$mode" --out "$out/fidelity-$mode.json" 2>&1 | tee "$out/fidelity-$mode.md" \
        || bench=$?
done

"$py" - "$out" "$tests" <<'EOF' > "$out/summary.md"
import json, re, sys, time
from pathlib import Path

import torch

out, tests_rc = Path(sys.argv[1]), int(sys.argv[2])
lines = (out / "pytest-gpu.txt").read_text().splitlines()
counts = [line for line in lines if re.match(r"=*\s*\d+ \w+.* in [0-9.]+s", line)]
print(f"# attnprof on a GPU, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
print(f"- GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__} (CUDA {torch.version.cuda})")
print(f"- `python -m pytest -m gpu`: {counts[-1].strip('= ') if counts else 'no summary line'} (exit {tests_rc})")
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
