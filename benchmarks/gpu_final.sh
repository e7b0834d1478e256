#!/usr/bin/env bash
# One GPU call (about eight minutes on an H200): the commit of a 24-layer model at k3-tp8
# (fp32 state, CUDA graphs; T=8 and 4, B=1, 8, 64, 256): a commit a layer (`commit`), kda's one
# commit of all layers (`commit-layers`) and each implementation's whole commit through its
# commit context (`commit-context`), kda's beside the example module's, and kda's with
# `one-launch-narrow` forced (whose tests run compiled first, forced); the corpus pool's
# cost per trace. `pytest -m gpu` of the files of the latest kernel and recording changes
# comes first, the other files' last, in the time left (TESTS_SECONDS, default 420).
# Everything to $OUT. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
first=(tests/test_commit_layers.py tests/test_example_engine.py tests/test_record_layers.py tests/test_record_patch.py
       tests/test_seed_kernels.py)
timeout -s TERM 150 python3 -m pytest -m gpu -q -x --timeout=120 "${first[@]}" 2>&1 \
    | tee "$OUT/pytest-gpu-first.txt" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
KDA_VARIANT=benchmarks/variants/commit_layers_narrow.py timeout -s TERM 100 python3 -m pytest -m gpu -q -x \
    --timeout=100 -p benchmarks.variants.forced tests/test_commit_layers.py -k "not until_a_layer" 2>&1 \
    | tee "$OUT/pytest-gpu-narrow.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout -s TERM 170 python3 -m kda_cli bench --spec-len 8,4 --batch 1,8,64,256 --layers 24 \
    --ops commit,commit-layers,commit-context --impl triton,examples/recoverssm_module.py,benchmarks/variants/commit_layers_narrow.py --row-seconds 0.15 \
    --reps 20 --force --save "$OUT/bench-context-L24.json" 2> "$OUT/bench-context-L24.log" || status=1
timeout 90 python3 benchmarks/corpus_overhead.py --traces 50 --impl triton 2>&1 | tee "$OUT/corpus-overhead.txt" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
rest=()
for f in tests/test_*.py; do [[ " ${first[*]} " == *" $f "* ]] || rest+=("$f"); done
timeout -s TERM "${TESTS_SECONDS:-420}" python3 -m pytest -m gpu -q -x --timeout=120 "${rest[@]}" 2>&1 \
    | tee "$OUT/pytest-gpu.txt" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
