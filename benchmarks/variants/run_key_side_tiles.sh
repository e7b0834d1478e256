#!/usr/bin/env bash
# The GPU side of the key side's tiles in one call (about six minutes):
#   OUT=DIR benchmarks/variants/run_key_side_tiles.sh [BKK:WARPS:CAP ...]
# `kda bench` at k3-tp8 (fp32 state, CUDA graphs), T=8 and 4, B=64, 128, 256: verify,
# flush-verify and both steps, the shipped kernels beside each setting's key side
# (benchmarks/variants/key_side_tiles.py) in one run; the `pytest -m gpu` verify tests under
# the first setting; kernel times inside the graphs (benchmarks/graph_kernel_times.py) of the
# shipped kernels and the first setting at T=8, B=256; then Nsight Compute of the shipped stock
# key side at T=8, B=256 (warp states, source counters). Results to $OUT: key-side-tiles.json,
# pytest-key-side.txt, graph-times-key-side.txt, ncu-key-side-verify.txt. BATCHES (default
# 64,128,256) names the batch sizes; BASELINE, a variant file timed after the shipped kernels.
# Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
SETTINGS=("$@")
[ ${#SETTINGS[@]} -gt 0 ] || SETTINGS=(16:1:- 32:1:- 16:1:80 16:2:- 32:2:-)
FILES=$(python3 benchmarks/variants/key_side_tiles.py "${TMPDIR:-/tmp}/key-side-tiles" "${SETTINGS[@]}")
status=0
note() {  # note STEP RC: print a step's exit status, remember a failure
    echo "$1: exit $2"
    [ "$2" -eq 0 ] || status=1
}
timeout -s TERM 420 python3 -m kda_cli bench --spec-len 8,4 --batch "${BATCHES:-64,128,256}" \
    --ops verify,flush-verify,step-stock,step-deferred --impl "triton,${BASELINE:+$BASELINE,}$FILES" \
    --row-seconds 0.1 --reps 20 --force --save "$OUT/key-side-tiles.json" 2> "$OUT/bench.log" | tail -n 80
note bench "${PIPESTATUS[0]}"
KDA_VARIANT="${FILES%%,*}" timeout -s TERM 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
    -p benchmarks.variants.forced tests/test_kernels.py -k "two_kernels or two-kernels or flush" \
    > "$OUT/pytest-key-side.txt" 2>&1
note "pytest (${SETTINGS[0]})" $?
tail -n 2 "$OUT/pytest-key-side.txt"
for impl in triton "${FILES%%,*}"; do
    echo "== $impl" >> "$OUT/graph-times-key-side.txt"
    timeout -s TERM 90 python3 benchmarks/graph_kernel_times.py --impl "$impl" --case 8:256 \
        --ops verify,step-deferred >> "$OUT/graph-times-key-side.txt" 2>&1
    note "graph times $(basename "$impl")" $?
done
for op in verify; do
    timeout -s TERM 120 ncu --clock-control none --profile-from-start off -k regex:_verify_key_side \
        --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
        --section SpeedOfLight --section InstructionStats --section SourceCounters \
        python3 benchmarks/profile_op.py "$op" 8:256 > "$OUT/ncu-key-side-$op.txt" 2>&1
    note "ncu $op" $?
done
exit "$status"
