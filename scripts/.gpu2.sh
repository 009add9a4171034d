python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/attnprof-triton -e plugins/attnprof-flash-attn >/dev/null 2>&1
export ATTNPROF_CACHE_DIR=/tmp/cache COLUMNS=160
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/plugins/attnprof-triton/src:$PWD/plugins/attnprof-flash-attn/src
( time timeout 100 python3 benchmarks/read_bandwidth.py --rounds 2 --out $OUT/read_bw.json ) > $OUT/read_bw.md 2>&1; tail -12 $OUT/read_bw.md
( time timeout 230 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_gpu_read_ceiling.py tests/test_gpu_paged.py tests/test_gpu_masks.py tests/test_gpu_impact.py plugins/attnprof-triton/tests plugins/attnprof-flash-attn/tests 2>&1 || true ) > $OUT/pytest2.txt 2>&1; tail -25 $OUT/pytest2.txt
( time timeout 240 attnprof check configs/expect-masks.yaml -o /tmp/chk --format markdown ) > $OUT/check.md 2>&1; grep -v "^\[" $OUT/check.md | tail -40
cd /tmp/chk && tar czf $OUT/chk.tgz $(find . -name "results.json" -o -name "*paged64*" -path "*flex*" | head -20); ls -la $OUT
