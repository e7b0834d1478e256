#!/usr/bin/env bash
# The one launch of 24 layers' commit at small batches against its variants, in one call of
# about two minutes on an H200 (issue 39: L=24, B=1 <= 12 us). `kda bench` of `commit-layers`
# at k3-tp8 (fp32 state, CUDA graphs), B=1,2,4,8, T=8 then T=4, the shipped kernels beside
# each variant of benchmarks/variants/layers_*.py (one process a T, so one copy ceiling for
# all); then each variant's compiled check: tests/test_commit_layers.py's Kimi-K3-shaped
# cases in align mode (4 layers, T=4 and 8; rows with and without a boundary) with the
# variant forced (benchmarks/variants/forced.py), which run its tiles and design on the real
# shape. The designs themselves, at small shapes and in CUDA graphs, are in `pytest -m gpu`.
# OUT (required) receives layers-variants-T8.json, layers-variants-T4.json and
# pytest-layers-variants.txt (earlier ones replaced); the tables go to stdout. Each step has a time limit; a bench
# stopped by its limit saves the rows it finished.
# Exit status: non-zero if a step failed or ran out of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
: > "$OUT/pytest-layers-variants.txt"
status=0
variants=(benchmarks/variants/layers_*.py)
impls="triton$(printf ',%s' "${variants[@]}")"

for T in 8 4; do
    timeout -s TERM 55 python3 -m kda_cli bench --spec-len "$T" --batch 1,2,4,8 --layers 24 --ops commit-layers \
        --impl "$impls" --row-seconds 0.1 --reps 20 --force --save "$OUT/layers-variants-T$T.json" || status=1
done

for variant in "${variants[@]}"; do
    echo "== $variant" | tee -a "$OUT/pytest-layers-variants.txt"
    KDA_VARIANT="$variant" timeout -s TERM 15 python3 -m pytest -m gpu -q -p benchmarks.variants.forced \
        tests/test_commit_layers.py -k "kimi_k3 and align" 2>&1 | tail -n 3 | tee -a "$OUT/pytest-layers-variants.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit "$status"
