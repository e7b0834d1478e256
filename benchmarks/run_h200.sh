#!/usr/bin/env bash
# The GPU run, in one call: kernel tests compiled (`pytest -m gpu`), `kda bench` over the
# k3-tp8 preset at T=8 (B=2-4 added to the default batches) and T=4, against plain stream
# order (no dependent launch) at T=8, and over the sample trace, then a k3-tp8 trace of 64
# requests synthesised and replayed through the Triton kernels and the reference.
# Runs from a plain checkout (kda need not be installed). Results go to $OUT (default
# benchmarks/results): at most eight files, the JSON runs and the logs; tables on stdout.
# BENCH_ARGS adds options to every `kda bench` (e.g. "--row-seconds 1"); SKIP_TESTS=1 leaves
# the tests to a call of their own.
# Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:-benchmarks/results}"
LOGS="${LOGS:-$(mktemp -d)}"
mkdir -p "$OUT"
status=0
kda() { python3 -m kda_cli "$@"; }

step() {  # step NAME COMMAND...: run, keep its stderr in $LOGS/NAME.log, note failure
    local name=$1
    shift
    "$@" 2> "$LOGS/$name.log"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        status=1
        echo "[$name] exit $rc"
        tail -n 5 "$LOGS/$name.log"
    fi
}

kda version --format json > "$OUT/environment.json" || status=1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    python3 -m pytest -m gpu -q 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -n 5
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
step bench-T8 kda bench --spec-len 8 --batch 1,2,3,4,8,32,64,128,256 --save "$OUT/bench-k3-tp8-T8.json" --force \
    ${BENCH_ARGS:-}
# shellcheck disable=SC2086
step bench-T4 kda bench --spec-len 4 --save "$OUT/bench-k3-tp8-T4.json" --force ${BENCH_ARGS:-}
# shellcheck disable=SC2086
step bench-dependent kda bench --spec-len 8 --ops verify,commit,step-stock,step-deferred \
    --impl triton,benchmarks/variants/plain_order.py --save "$OUT/bench-dependent-launch.json" --force ${BENCH_ARGS:-}
# shellcheck disable=SC2086
step bench-trace kda bench --trace traces/samples/k3-tp8-sample.safetensors \
    --save "$OUT/bench-trace-sample.json" --force ${BENCH_ARGS:-} > "$LOGS/bench-trace.txt"

trace="$LOGS/k3-tp8-64req.safetensors"
step synth kda synth "$trace" --force --preset k3-tp8 --mode mixed --requests 64 --max-batch 8 --seed 1 > /dev/null
step replay-triton kda replay "$trace" --impl triton --format json > "$OUT/replay-k3-triton.json"
step replay-reference kda replay "$trace" --impl reference --format json > "$OUT/replay-k3-reference.json"
python3 - "$OUT" <<'PY'
import json, sys
for impl in ("triton", "reference"):
    r = json.load(open(f"{sys.argv[1]}/replay-k3-{impl}.json"))
    ops = {op: (s["events"], s["median_ms"]) for op, s in r["summary"].items()}
    print(f"replay {impl}: passed={r['passed']} events={len(r['events'])} (events, median ms) per op: {ops}")
PY
exit "$status"
