#!/usr/bin/env bash
# Side-by-side H200 run of the shipped launch choices against each simpler variant in this
# folder (k3-tp8, CUDA graphs, one `kda bench` per group so each group shares one copy
# ceiling and one process). Results: $OUT/designs-*.json and the tables on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:-benchmarks/results}"
V=benchmarks/variants
ARGS=(--row-seconds 0.15 --reps 30)
kda() { python3 -m kda_cli "$@"; }
status=0

run() {  # run NAME SECONDS BENCH-ARGS...: one bench, bounded in time, saved to $OUT/designs-NAME.json
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    timeout -s TERM "$limit" python3 -m kda_cli bench "$@" "${ARGS[@]}" --save "$OUT/designs-$name.json" \
        2> "$OUT/designs-$name.log" || { status=1; tail -n 3 "$OUT/designs-$name.log"; }
}

run small 260 --spec-len 4,8 --batch 1,2,4,8,16,32 --ops verify,commit,flush-verify,step-stock,step-deferred \
    --impl triton,$V/no_flush_apart.py,$V/uniform_register_budget.py,$V/verify_two_kernels.py,$V/plain_order.py
run large 260 --spec-len 4,8 --batch 64,128,256 --ops verify,commit,flush-verify,step-stock,step-deferred \
    --impl triton,$V/no_flush_register_caps.py,$V/plain_order.py
exit "$status"
