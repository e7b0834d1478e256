#!/usr/bin/env bash
# The multi-layer commit on the GPU, in one call: the commit context's tests compiled, then
# `kda bench` of a model of L = 1 and 24 layers at k3-tp8 (fp32 state, CUDA graphs), T=8 and
# T=4, B=1,8,64,256: per row a commit a layer (`commit`: L calls of kda_recoverssm_commit),
# the one commit of all layers (`commit-layers`, as the decision table launches it) and the
# stock step (L verifies, one plan, one commit of all layers), beside the same with every
# commit of all layers forced into one launch (benchmarks/variants/commit_layers_one_launch.py).
# Results go to $OUT (default benchmarks/results): the JSON runs; tables on stdout.
# Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
status=0
python3 -m pytest -m gpu -q tests/test_commit_layers.py 2>&1 | tee "$OUT/pytest-commit-layers.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
for T in 8 4; do
    for L in 1 24; do
        python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 --layers "$L" \
            --ops commit,commit-layers,step-stock \
            --impl triton,benchmarks/variants/commit_layers_one_launch.py \
            --save "$OUT/bench-layers-L$L-T$T.json" || status=1
    done
done
exit "$status"
