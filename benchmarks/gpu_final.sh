#!/usr/bin/env bash
# One GPU call (about eight minutes on an H200; `pytest -m gpu` alone now takes more than
# five): `pytest -m gpu` of the shipped kernels, the corpus pool's cost per trace, and 24
# layers' one-launch commit variants against the shipped launch at T=8, B=1-8. Everything to
# $OUT. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
status=0
SKIP_BENCH=1 bash benchmarks/gpu_check.sh | tail -n 3  # pytest -m gpu into $OUT/pytest-gpu.txt
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 100 python3 benchmarks/corpus_overhead.py --traces 50 --impl triton 2>&1 | tee "$OUT/corpus-overhead.txt" | tail -n 4
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
variants=(benchmarks/variants/layers_*.py)
timeout -s TERM 55 python3 -m kda_cli bench --spec-len 8 --batch 1,2,4,8 --layers 24 --ops commit-layers \
    --impl "triton$(printf ',%s' "${variants[@]}")" --row-seconds 0.1 --reps 20 --force \
    --save "$OUT/layers-variants-T8.json" > /dev/null || status=1
exit "$status"
