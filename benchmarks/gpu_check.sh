#!/usr/bin/env bash
# A change's GPU check: the kernel tests compiled
# (`pytest -m gpu` within 420 s, stopping at the first failure or at a test past 120 s),
# then, unless SKIP_BENCH=1, `kda bench` over k3-tp8 at T=8 and T=4, B=1,8,64,256, for
# verify, commit, flush-verify and both decode steps, 90 s each (a bench stopped by its
# time saves the rows it finished): up to ten minutes, so in one device call (ten minutes at
# most) run it with SKIP_BENCH=1 and the benches in the next. Runs from a plain checkout.
# OUT (required) receives pytest-gpu.txt, bench-T8.json and bench-T4.json; the tables go to
# stdout. BENCH_ARGS replaces the sampling options (default "--row-seconds 0.15 --reps 30").
# `benchmarks/run_h200.sh` is the full run that remakes benchmarks/results.
# Exit status: non-zero if a step failed or ran out of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0

timeout -s TERM 420 python3 -m pytest -m gpu -q -x --timeout=120 2>&1 | tee "$OUT/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    for T in 8 4; do
        # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
        timeout -s TERM 90 python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 \
            --ops verify,commit,flush-verify,step-stock,step-deferred ${BENCH_ARGS:---row-seconds 0.15 --reps 30} \
            --save "$OUT/bench-T$T.json" || status=1
    done
fi
exit "$status"
