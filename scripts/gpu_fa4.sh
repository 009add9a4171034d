#!/usr/bin/env bash
# Second of two back-to-back device calls: FlashAttention-4 through the attnprof-flash-attn plugin,
# next to sdpa-cudnn, sdpa-flash and triton-flash, plus attnprof's overhead benchmark.
# The first call copied .fa4a/part_aa to /tmp/keep (see ../shared/device/README.md).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnprof-fa4}; mkdir -p "$OUT"
W=/tmp/attnprof-work; rm -rf "$W"; mkdir -p "$W"
step() { echo; echo "=== $* ($(date +%T))"; }

step install
big=/tmp/$(cat .fa4b/BIG_WHEEL_NAME)
cat /tmp/keep/part_aa .fa4b/part_ab > "$big" && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .fa4b/*.whl "$big" .whl/*.whl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/attnprof-triton -e plugins/attnprof-flash-attn 2>&1 | grep -v WARNING
python3 -c "from flash_attn.cute import flash_attn_func; print('FA4 imports')"

step pytest flash-attn plugin
timeout -s INT ${T_PYTEST:-90} python3 -m pytest -m gpu -q -p no:cacheprovider plugins/attnprof-flash-attn/tests > "$W/pytest_fa4.txt" 2>&1
echo "pytest exit $?"; tail -5 "$W/pytest_fa4.txt"

step compare fused kernels
timeout -s INT ${T_COMPARE:-120} attnprof compare configs/h200.yaml --variants flash-attn --variants sdpa-cudnn --variants sdpa-flash \
  --variants triton-flash --baseline sdpa-cudnn --format markdown -o "$W/fa4" > "$W/fa4.md" 2> "$W/fa4.err"
echo "compare exit $?"; tail -3 "$W/fa4.err"

step overhead benchmark
timeout -s INT ${T_OVERHEAD:-150} python3 benchmarks/overhead.py --out "$W/overhead.json" > "$W/overhead.txt" 2>&1
echo "overhead exit $?"; tail -25 "$W/overhead.txt"

step pack
tar czf "$OUT/fa4.tar.gz" -C "$W" . && ls -la "$OUT"
grep -E "^\| (flash-attn|sdpa-cudnn|sdpa-flash|triton-flash) " "$W/fa4.md" | cut -c1-220
