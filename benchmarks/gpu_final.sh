#!/usr/bin/env bash
# One GPU call (under ten minutes): `kda bench` k3-tp8 at T=8 and T=4 over verify, commit,
# flush-verify and both decode steps (bench-k3-tp8-T8.json, -T4.json); the commit of a model
# at k3-tp8 (fp32 state, CUDA graphs; T=8 and 4) at L=24 (B=1-256) and L=1 (B=1, 8, 64,
# 256): a commit a layer (`commit`), kda's one commit of all layers (`commit-layers`) and each
# implementation's whole commit through its commit context (`commit-context`), kda's beside
# the example module's; then the whole `pytest -m gpu`. Everything to $OUT (seven files: the
# device, four JSON runs, the benches' progress in bench.log, pytest-gpu.txt). Each step prints
# its exit status; the script's is non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/device.txt"
for T in 8 4; do
    timeout -s TERM 90 python3 -m kda_cli bench --spec-len "$T" --batch 1,2,4,8,64,128,256 \
        --ops verify,commit,flush-verify,step-stock,step-deferred --row-seconds 0.12 --reps 25 \
        --force --save "$OUT/bench-k3-tp8-T$T.json" 2>> "$OUT/bench.log"
    rc=$?
    [ "$rc" -eq 0 ] || status=1
    echo "bench k3-tp8 T=$T: exit $rc"
done
bench() {  # name layers batches
    timeout -s TERM 170 python3 -m kda_cli bench --spec-len 8,4 --batch "$3" --layers "$2" \
        --ops commit,commit-layers,commit-context --impl triton,examples/recoverssm_module.py \
        --row-seconds 0.12 --reps 20 --force --save "$OUT/$1.json" 2>> "$OUT/bench.log"
    local rc=$?
    [ "$rc" -eq 0 ] || status=1
    echo "bench $1: exit $rc"
}
bench bench-context-L24 24 1,8,16,32,64,256
bench bench-context-L1 1 1,8,64,256
timeout -s TERM 330 python3 -m pytest -m gpu -q -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1
rc=$?
[ "$rc" -eq 0 ] || status=1
tail -n 2 "$OUT/pytest-gpu.txt"
echo "pytest -m gpu: exit $rc"
exit "$status"
