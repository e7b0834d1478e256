#!/usr/bin/env bash
# The commit contexts side by side on the GPU, in one call: the tests of the example module's
# context (bit for bit against kda's, captured in a CUDA graph), the example engine's context
# mode (its step with the commit replayed from a CUDA graph against the same step run eagerly)
# and the bench's commit-context rows, on CUDA; then `kda bench` at k3-tp8 (fp32 state, CUDA
# graphs), T=8 and 4, L=1 and 24, B=1,8,64,256: kda's one commit of all layers
# (`commit-layers`) and each implementation's whole commit through its commit context
# (`commit-context`: plan, conv windows, state), kda's (`triton`) beside the example module's;
# and the example engine with --commit context --graphs at --preset k3.
# Results go to $OUT (default benchmarks/results): pytest output and the JSON runs; tables on
# stdout. Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
status=0
python3 -m pytest -q tests/test_commit_layers.py tests/test_example_engine.py tests/test_bench.py \
    -k "example_module or conv_window_bug or context or conv_update" 2>&1 | tee "$OUT/pytest-commit-context.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
for T in 8 4; do
    for L in 1 24; do
        python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 --layers "$L" --row-seconds 0.5 \
            --ops commit-layers,commit-context --impl triton,examples/recoverssm_module.py \
            --save "$OUT/bench-context-L$L-T$T.json" || status=1
    done
done
python3 examples/serve_engine.py --commit context --graphs --preset k3 --layers 4 --steps 8 || status=1
exit "$status"
