#!/usr/bin/env bash
# The persistent state kernel (`two-kernels-persistent`, forced only) against the shipped
# kernels in one GPU call of about four minutes on an H200. One `kda bench` at k3-tp8 (fp32
# state, CUDA graphs) of verify, flush-verify, step-stock and step-deferred at T=8 and 4,
# B=64,128,256 (where the shipped launch runs the two kernels), the shipped kernels beside
# benchmarks/variants/persistent_state.py, in one process (one copy ceiling); then the
# design's own tests compiled (`pytest -m gpu tests/test_kernels.py -k persistent`: the
# round trips, the programs that walk several tiles past the last, Kimi-K3 shapes at 256
# rows), and the decode steps in dependent launch and CUDA graphs against plain stream order
# with the design forced at B=16, 64, 256 (benchmarks/variants/forced.py).
# OUT (required) receives persistent-state.json (the bench), persistent-state.log (its
# stderr) and pytest-persistent-state.txt; the table goes to stdout. Each step has a time
# limit; a bench stopped by its limit saves the rows it finished.
# Exit status: non-zero if a step failed or ran out of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0

timeout -s TERM 150 python3 -m kda_cli bench --spec-len 8,4 --batch 64,128,256 \
    --ops verify,flush-verify,step-stock,step-deferred --impl triton,benchmarks/variants/persistent_state.py \
    --row-seconds 0.15 --reps 30 --force --save "$OUT/persistent-state.json" 2> "$OUT/persistent-state.log" \
    || { status=1; tail -n 3 "$OUT/persistent-state.log"; }

tests="$OUT/pytest-persistent-state.txt"
: > "$tests"
echo "== pytest -m gpu tests/test_kernels.py -k persistent" | tee -a "$tests"
timeout -s TERM 100 python3 -m pytest -m gpu -q tests/test_kernels.py -k persistent 2>&1 | tail -n 15 | tee -a "$tests"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# (not at B=3, whose test expects the flushing token loop's counters)
stream_order=tests/test_kernels.py::test_dependent_launch_keeps_stream_order
stream_order=("$stream_order[16]" "$stream_order[64]" "$stream_order[256]")
echo "== forced at B=16, 64, 256: ${stream_order[*]}" | tee -a "$tests"
KDA_VARIANT=benchmarks/variants/persistent_state.py timeout -s TERM 40 python3 -m pytest -m gpu -q \
    -p benchmarks.variants.forced "${stream_order[@]}" 2>&1 | tail -n 15 | tee -a "$tests"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
