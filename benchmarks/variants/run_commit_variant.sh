#!/usr/bin/env bash
# The GPU side of a commit variant in one call (about five minutes):
#   benchmarks/variants/run_commit_variant.sh benchmarks/variants/NAME.py
# the commit-context, recording and trace tests compiled (`pytest -m gpu`), under the decision
# table's designs and again under the variant (`benchmarks/variants/forced.py`); then `kda
# bench` at k3-tp8 (fp32 state, CUDA graphs), T=8 and 4, L=24 and L=1: `commit-layers` and
# `commit-context`, the shipped kernels beside the variant's in one run. Results to $OUT:
# pytest-tables.txt, pytest-NAME.txt, NAME-L24.json, NAME-L1.json. BATCHES (default
# 1,8,32,64,256) names the batch sizes.
# Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. NO_COLOR=1
OUT="${OUT:?set OUT to the folder that receives the results}"
VARIANT="${1:?name a variant file: benchmarks/variants/NAME.py}"
NAME=$(basename "$VARIANT" .py)
TESTS=(tests/test_commit_layers.py tests/test_record_layers.py tests/test_trace_v2.py)
status=0
note() {  # note STEP RC: print a step's exit status, remember a failure
    echo "$1: exit $2"
    [ "$2" -eq 0 ] || status=1
}
timeout -s TERM 150 python3 -m pytest -m gpu -q -p no:cacheprovider "${TESTS[@]}" > "$OUT/pytest-tables.txt" 2>&1
note "pytest (the table's designs)" $?
tail -n 2 "$OUT/pytest-tables.txt"
KDA_VARIANT="$VARIANT" timeout -s TERM 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
    -p benchmarks.variants.forced -k "not until_a_layer" "${TESTS[@]}" > "$OUT/pytest-$NAME.txt" 2>&1
note "pytest ($NAME)" $?
tail -n 2 "$OUT/pytest-$NAME.txt"
for L in 24 1; do
    timeout -s TERM 150 python3 -m kda_cli bench --spec-len 8,4 --batch "${BATCHES:-1,8,32,64,256}" --layers "$L" \
        --ops commit-layers,commit-context --impl "triton,$VARIANT" \
        --row-seconds 0.12 --reps 20 --force --save "$OUT/$NAME-L$L.json" 2> /dev/null | tail -n 24
    note "bench L=$L" "${PIPESTATUS[0]}"
done
exit "$status"
