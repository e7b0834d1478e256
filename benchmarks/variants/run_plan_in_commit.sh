#!/usr/bin/env bash
# The GPU side of `plan_in_commit.py` in one call (about five minutes): the commit-context,
# recording and trace tests compiled (`pytest -m gpu`), under the decision table's designs and
# again with `commit-context=plan-in-commit` forced; then `kda bench` at k3-tp8 (fp32 state,
# CUDA graphs), T=8 and 4, L=24 and L=1: `commit-layers` and `commit-context`, the shipped
# context beside the variant's in one run. Results to $OUT: pytest-*.txt, plan-in-commit-*.json.
# Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
TESTS=(tests/test_commit_layers.py tests/test_record_layers.py tests/test_trace_v2.py)
status=0
note() {  # note NAME RC: print a step's exit status, remember a failure
    echo "$1: exit $2"
    [ "$2" -eq 0 ] || status=1
}
timeout -s TERM 150 python3 -m pytest -m gpu -q -p no:cacheprovider "${TESTS[@]}" > "$OUT/pytest-tables.txt" 2>&1
note "pytest (the table's designs)" $?
tail -n 2 "$OUT/pytest-tables.txt"
KDA_VARIANT=benchmarks/variants/plan_in_commit.py timeout -s TERM 150 python3 -m pytest -m gpu -q \
    -p no:cacheprovider -p benchmarks.variants.forced "${TESTS[@]}" > "$OUT/pytest-plan-in-commit.txt" 2>&1
note "pytest (plan-in-commit forced)" $?
tail -n 2 "$OUT/pytest-plan-in-commit.txt"
for L in 24 1; do
    timeout -s TERM 120 python3 -m kda_cli bench --spec-len 8,4 --batch 1,8,32,64,256 --layers "$L" \
        --ops commit-layers,commit-context --impl triton,benchmarks/variants/plan_in_commit.py \
        --row-seconds 0.12 --reps 20 --force --save "$OUT/plan-in-commit-L$L.json" 2> /dev/null | tail -n 24
    note "bench L=$L" "${PIPESTATUS[0]}"
done
exit "$status"
