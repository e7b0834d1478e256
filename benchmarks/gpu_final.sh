#!/usr/bin/env bash
# One GPU call (about nine minutes on an H200): the commit of a 24-layer model at k3-tp8
# (fp32 state, CUDA graphs; T=8 and 4, B=1-256): a commit a layer (`commit`), kda's one
# commit of all layers (`commit-layers`) and each implementation's whole commit through its
# commit context (`commit-context`), kda's beside the example module's; the corpus pool's
# cost per trace; then `pytest -m gpu` of the shipped kernels in the time left (gpu_check.sh).
# Everything to $OUT. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
timeout -s TERM 170 python3 -m kda_cli bench --spec-len 8,4 --batch 1,2,4,8,16,32,64,256 --layers 24 \
    --ops commit,commit-layers,commit-context --impl triton,examples/recoverssm_module.py --row-seconds 0.2 \
    --reps 20 --force --save "$OUT/bench-context-L24.json" 2> "$OUT/bench-context-L24.log" || status=1
timeout 90 python3 benchmarks/corpus_overhead.py --traces 50 --impl triton 2>&1 | tee "$OUT/corpus-overhead.txt" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
SKIP_BENCH=1 bash benchmarks/gpu_check.sh | tail -n 3  # pytest -m gpu into $OUT/pytest-gpu.txt
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
