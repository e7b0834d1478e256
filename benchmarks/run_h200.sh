#!/usr/bin/env bash
# The H200 benchmark run: GPU kernel tests, then `kda bench` (k3-tp8, default batches) at
# T=8 and T=4, then each event of the sample trace. Runs from a plain checkout (kda need not
# be installed). Everything goes to $OUT (default benchmarks/results): the test log, and per
# bench run its table (.txt), progress log (.log), JSON run (.json) and plot (.png).
# Exit status: non-zero if the tests or any bench run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
status=0

bench() {  # bench NAME ARGS...: one `kda bench` run saved as $OUT/NAME.*
    local name=$1
    shift
    python3 -m kda_cli bench "$@" --save "$OUT/$name.json" > "$OUT/$name.txt" 2> "$OUT/$name.log"
    local rc=$?
    cat "$OUT/$name.txt"
    if [ "$rc" -ne 0 ]; then
        status=1
        tail -n 5 "$OUT/$name.log"
    fi
}

python3 -m kda_cli version --format json > "$OUT/environment.json" || status=1
python3 -m pytest -m gpu -q 2>&1 | tee "$OUT/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

bench bench-k3-tp8-T8 --spec-len 8 --plot "$OUT/bench-k3-tp8-T8.png"
bench bench-k3-tp8-T4 --spec-len 4 --plot "$OUT/bench-k3-tp8-T4.png"
bench bench-trace-sample --trace traces/samples/k3-tp8-sample.safetensors
exit "$status"
