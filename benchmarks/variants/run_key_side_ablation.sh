#!/usr/bin/env bash
# The GPU side of the key side's ablations in one call (about three minutes):
#   OUT=DIR benchmarks/variants/run_key_side_ablation.sh [NAME ...]
# `kda bench` at k3-tp8 (fp32 state, CUDA graphs), T=8, B=128 and 256: verify and flush-verify,
# the shipped kernels beside each ablation of benchmarks/variants/key_side_ablation.py (timing
# only: their results are wrong) in one run; then kernel times inside the graph
# (benchmarks/graph_kernel_times.py) of the verify at B=256 for each. Results to $OUT:
# key-side-ablation.json, graph-times-key-side-ablation.txt. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(tf32 no-product no-gates no-mix)
FILES=$(python3 benchmarks/variants/key_side_ablation.py "${TMPDIR:-/tmp}/key-side-ablation" "${NAMES[@]}")
status=0
note() {  # note STEP RC: print a step's exit status, remember a failure
    echo "$1: exit $2"
    [ "$2" -eq 0 ] || status=1
}
timeout -s TERM 240 python3 -m kda_cli bench --spec-len 8 --batch 128,256 --ops verify,flush-verify \
    --impl "triton,$FILES" --row-seconds 0.1 --reps 20 --force --save "$OUT/key-side-ablation.json" \
    2> "$OUT/bench.log" | tail -n 30
note bench "${PIPESTATUS[0]}"
for impl in triton ${FILES//,/ }; do
    echo "== $(basename "$impl")" >> "$OUT/graph-times-key-side-ablation.txt"
    timeout -s TERM 60 python3 benchmarks/graph_kernel_times.py --impl "$impl" --case 8:256 --ops verify \
        2>/dev/null | grep -v "^$" >> "$OUT/graph-times-key-side-ablation.txt"
    note "graph times $(basename "$impl")" "${PIPESTATUS[0]}"
done
exit "$status"
