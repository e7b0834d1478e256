#!/usr/bin/env bash
# The split products (`KDA_DESIGN=products=split-tf32`, kernels/triton_math.py `dot_f32`) on
# the GPU in one call (about 150 s): the kernel tests of every design that takes products
# (the stock round trip on K3's head dims and on bfloat16 state),
# compiled on them (`pytest -m gpu -x`, 70 s), then `kda bench` of the shipped kernels against
# benchmarks/variants/split_dot.py over k3-tp8 at T=8, B=64,128,256 (55 s) and at T=4, B=256
# (25 s); a bench stopped by its time saves the rows it finished. Runs from a plain checkout.
# OUT (required) receives pytest-split-dot.txt, split-dot-T8.json and split-dot-T4.json; the
# tables go to stdout. Exit status: non-zero if a step failed or ran out of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
status=0
TESTS="test_products or (stock_two_rounds and (k128 or v48) and not token-loop-token-loop) or (deferred_two_rounds and fold) \
or (flush_verify_matches and two-kernels) or (align_commit and fold) or (kimi_k3 and not token-loop)"

KDA_DESIGN=products=split-tf32 timeout -s TERM 70 python3 -m pytest -m gpu -q -x --timeout=60 \
    tests/test_products.py tests/test_kernels.py -k "$TESTS" 2>&1 | tee "$OUT/pytest-split-dot.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

bench() {  # bench SECONDS T BATCHES
    timeout -s TERM "$1" python3 -m kda_cli bench --spec-len "$2" --batch "$3" \
        --ops verify,commit,flush-verify,step-stock,step-deferred --impl triton,benchmarks/variants/split_dot.py \
        --row-seconds 0.1 --reps 20 --save "$OUT/split-dot-T$2.json" || status=1
}
bench 55 8 64,128,256
bench 25 4 256
exit "$status"
