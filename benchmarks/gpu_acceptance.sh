#!/usr/bin/env bash
# The GPU side of the open issues in one call (about eight minutes), each step under a time
# limit of its own, everything saved to $OUT:
#   1. the raw kernels against the seed's, compiled (pytest-seed.txt);
#   2. `kda bench` k3-tp8 at T=8 and T=4 over verify, commit, flush-verify and both decode
#      steps (bench-k3-tp8-T8.json, -T4.json), the shipped kernels' numbers;
#   3. a model of 24 layers' commit at T=4 (bench-layers-L24-T4.json);
#   4. a 50-trace corpus replayed through one pool worker against a plain loop
#      (corpus-overhead.txt);
#   5. the example engine at K3 shapes, its decode step captured in CUDA graphs, recorded
#      unedited and replayed (engine-*.txt, engine-graphs.safetensors is not kept).
# Runs from a plain checkout (PYTHONPATH=.). Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
BENCH_ARGS="${BENCH_ARGS:---row-seconds 0.15 --reps 30}"
status=0
step() { echo "== $1"; }

step "seed kernels"
timeout 120 python3 -m pytest -m gpu -q tests/test_seed_kernels.py 2>&1 | tee "$OUT/pytest-seed.txt" | tail -n 2
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

for T in 8 4; do
    step "bench T=$T"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    timeout -s TERM 130 python3 -m kda_cli bench --spec-len "$T" --batch 1,2,4,8,64,128,256 \
        --ops verify,commit,flush-verify,step-stock,step-deferred $BENCH_ARGS --force \
        --save "$OUT/bench-k3-tp8-T$T.json" || status=1
done

step "24 layers, T=4"
timeout -s TERM 70 python3 -m kda_cli bench --spec-len 4 --batch 1,8,64,256 --layers 24 \
    --ops commit,commit-layers,step-stock --row-seconds 0.1 --reps 20 --force \
    --save "$OUT/bench-layers-L24-T4.json" || status=1

step "corpus"
timeout 100 python3 benchmarks/corpus_overhead.py --traces 50 --impl triton 2>&1 | tee "$OUT/corpus-overhead.txt" \
    | tail -n 8
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "example engine in CUDA graphs"
trace=$(mktemp -d)/engine-graphs.safetensors
timeout 60 python3 examples/serve_engine.py --graphs --preset k3 --mode mixed > "$OUT/engine-plain.txt" 2>&1 || status=1
timeout 90 python3 -m kda_cli record run "$trace" --patch examples.recoverssm_module --format json -- \
    python3 examples/serve_engine.py --graphs --preset k3 --mode mixed > "$OUT/engine-record.json" \
    2> "$OUT/engine-record-stderr.txt" || status=1
python3 -m kda_cli info "$trace" > "$OUT/engine-info.txt" 2>&1
timeout 90 python3 -m kda_cli replay "$trace" --impl triton --no-progress > "$OUT/engine-replay.txt" 2>&1 || status=1
tail -n 4 "$OUT/engine-replay.txt"
exit "$status"
