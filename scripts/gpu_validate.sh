#!/usr/bin/env bash
# One full validation pass on a CUDA machine (the lent H200): install offline, run the GPU tests,
# compare the a100 and h200 configs, and pack results and small traces into $OUT.
# Usage on the device:  bash scripts/gpu_validate.sh   (needs .whl/ from ../shared/device/wheels.sh)
# STEPS picks the steps after install (default: all but the two benchmarks), e.g.
#   STEPS="pytest list a100 run fidelity overhead" bash scripts/gpu_validate.sh
set -u
STEPS=" ${STEPS:-pytest list a100 h200 run} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnprof-validate}; mkdir -p "$OUT"
W=/tmp/attnprof-work; rm -rf "$W"; mkdir -p "$W"
step() { echo; echo "=== $* ($(date +%T))"; }

step install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/attnprof-triton -e plugins/attnprof-flash-attn 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$W/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)" | tee -a "$W/gpu.txt"

if want pytest; then
step pytest -m gpu
timeout -s INT ${T_PYTEST:-240} python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TESTS:-tests plugins/attnprof-triton/tests plugins/attnprof-flash-attn/tests} > "$W/pytest_gpu.txt" 2>&1
echo "pytest exit $?"; tail -15 "$W/pytest_gpu.txt"
fi

if want list; then
step list
attnprof list --config configs/h200.yaml > "$W/list.txt" 2>&1; cat "$W/list.txt"
fi

if want a100; then
step compare a100
timeout -s INT ${T_A100:-120} attnprof compare configs/a100.yaml --check-masking --format markdown -o "$W/a100" > "$W/a100.md" 2> "$W/a100.err"
echo "compare a100 exit $?"; cat "$W/a100.md"
fi

if want h200; then
step compare h200
timeout -s INT ${T_H200:-240} attnprof compare configs/h200.yaml --format markdown -o "$W/h200" > "$W/h200.md" 2> "$W/h200.err"
echo "compare h200 exit $?"; grep -v '^$' "$W/h200.md" | head -60
fi

if want run; then
step run sdpa-cudnn, then triton-flash under --cuda-graph with a re-measured ceiling
timeout -s INT ${T_RUN:-60} attnprof run --variant sdpa-cudnn --config configs/a100.yaml -o "$W/run" > "$W/run_cudnn.txt" 2>&1; echo "run exit $?"
timeout -s INT ${T_RUN:-60} attnprof run --variant triton-flash --config configs/a100.yaml --cuda-graph --refresh-ceiling \
  -o "$W/run_graph" > "$W/run_triton_graph.txt" 2>&1; echo "run --cuda-graph exit $?"; tail -25 "$W/run_triton_graph.txt"
fi

if want fidelity; then
step fidelity benchmark
timeout -s INT ${T_FIDELITY:-180} python3 benchmarks/fidelity.py --out "$W/fidelity.json" > "$W/fidelity.md" 2> "$W/fidelity.err"
echo "fidelity exit $?"; cat "$W/fidelity.md"
fi

if want overhead; then
step overhead benchmark
timeout -s INT ${T_OVERHEAD:-150} python3 benchmarks/overhead.py --out "$W/overhead.json" > "$W/overhead.md" 2> "$W/overhead.err"
echo "overhead exit $?"; tail -20 "$W/overhead.md"
fi

step pack
tar czf "$OUT/validate.tar.gz" -C "$W" . && ls -la "$OUT"
