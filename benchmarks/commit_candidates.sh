#!/usr/bin/env bash
# One GPU call (about five minutes): the commit of several layers against the tree before a
# change. `pytest -m gpu` of the commit of several layers and the engine's commit context
# (every design, the conv windows inside the one launch forced), then `kda bench` at k3-tp8
# (fp32 state, CUDA graphs, L=24, T=8 and 4, B=1-64): this tree's commit-layers beside
# `variants/prepared_keys.py`, its commit-context beside `variants/conv_in_commit.py` and
# `variants/prepared_keys_conv_in_commit.py`, then both ops on the tree at BASE (a folder
# holding the other tree, e.g. an unpacked `git archive`), if given. Then Nsight Compute over
# one commit-layers call at B=1 (T=8) of this tree, each design, if `ncu` is there. Everything to $OUT.
# Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout -s TERM 200 python3 -m pytest -m gpu -q -x --timeout=120 tests/test_commit_layers.py \
    tests/test_example_engine.py 2>&1 | tee "$OUT/pytest-gpu-commit.txt" | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
bench() {  # name tree ops batches impls
    (cd "$2" && PYTHONPATH=. timeout -s TERM 150 python3 -m kda_cli bench --spec-len 8,4 --batch "$4" --layers 24 \
        --ops "$3" --impl "$5" --row-seconds 0.1 --reps 20 --force --save "$OUT/$1.json" 2> "$OUT/$1.log") || status=1
}
V=benchmarks/variants
bench layers . commit-layers 1,2,4,8,16,32,64 "triton,$V/prepared_keys.py"
bench context . commit-context 1,8,64 "triton,$V/conv_in_commit.py,$V/prepared_keys_conv_in_commit.py"
[ -n "${BASE:-}" ] && bench base "$BASE" commit-layers,commit-context 1,2,4,8,16,32,64 triton
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
if [ -n "$NCU" ]; then
    for design in one-launch prepared-keys; do
        KDA_DESIGN=commit-layers=$design timeout -s TERM 60 "$NCU" --profile-from-start off --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
            python3 benchmarks/profile_op.py --layers 24 commit-layers 8:1 > "$OUT/ncu-$design-L24-T8-B1.txt" 2>&1
    done
fi
exit "$status"
