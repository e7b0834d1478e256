#!/usr/bin/env bash
# One GPU call (about six minutes): `pytest -m gpu` of the commit of several layers and the
# engine's commit context (tests/test_commit_layers.py, tests/test_example_engine.py), then the
# commit of a model at k3-tp8 (fp32 state, CUDA graphs; T=8 and 4) at L=24 (B=1-256) and L=1
# (B=1, 8, 64, 256): a commit a layer (`commit`), kda's one commit of all layers
# (`commit-layers`) and each implementation's whole commit through its commit context
# (`commit-context`), kda's beside the example module's. Everything to $OUT. Exit status:
# non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
timeout -s TERM 150 python3 -m pytest -m gpu -q -x --timeout=120 tests/test_commit_layers.py \
    tests/test_example_engine.py 2>&1 | tee "$OUT/pytest-gpu-commit.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
bench() {  # name layers batches
    timeout -s TERM 200 python3 -m kda_cli bench --spec-len 8,4 --batch "$3" --layers "$2" \
        --ops commit,commit-layers,commit-context --impl triton,examples/recoverssm_module.py \
        --row-seconds 0.12 --reps 20 --force --save "$OUT/$1.json" 2> "$OUT/$1.log" || status=1
}
bench bench-context-L24 24 1,8,16,32,64,256
bench bench-context-L1 1 1,8,64,256
exit "$status"
