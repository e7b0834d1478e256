#!/usr/bin/env bash
# The candidate `flush-apart-rows-ahead` (the flush apart's verify reads its rows before it
# waits for the fold) on the GPU, in one call of about three minutes: the flushing verify's
# tests compiled (every flush-verify design, the candidate among them), then one `kda bench`
# (k3-tp8, fp32 state, CUDA graphs, T=8 and 4, B=1, 2, 4) of the flushing verify and both
# decode steps, shipped against the flush apart forced and the candidate forced. Results to
# $OUT. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
timeout -s TERM 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels.py -k flush 2>&1 \
    | tee "$OUT/pytest-flush.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
V=benchmarks/variants
timeout -s TERM 200 python3 -m kda_cli bench --spec-len 8,4 --batch 1,2,4 --ops flush-verify,step-stock,step-deferred \
    --impl "triton,$V/flush_apart.py,$V/flush_apart_rows_ahead.py" --row-seconds 0.15 --reps 30 --force \
    --save "$OUT/bench-flush-apart.json" 2> "$OUT/bench-flush-apart.log" || status=1
exit "$status"
