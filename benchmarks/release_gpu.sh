#!/usr/bin/env bash
# The released vLLM 0.33.0 stock module on a GPU, in one device call a suite:
#   SUITE=tests  its tests compiled (tests/test_vllm_release.py, the recorder's exact calls, the
#                commit contexts' -m gpu tests), then examples/vllm_engine.py at Kimi-K3 shapes
#                (H=12, K=V=128, 3 layers; T=8 and 4; fp32 and bf16 state; stock and align
#                mode; both conv layouts; CUDA graphs and eager) recorded with
#                --patch MODULE --layers all and replayed through triton, reference and the
#                release itself (bit for bit): one line each, to $OUT/engines.txt;
#   SUITE=bench  kda bench --impl triton,MODULE: verify at T=8, B=1,8,64,256, and the commit
#                context (the whole commit of every layer) at L=1 and L=24, saved to $OUT.
# The release's module comes from the tree tests/vllm_release.py lays (pip download, here),
# copied into the ignored folder .vllm/ and carried: KDA_VLLM_CACHE=.vllm.
# OUT (required) receives the logs and JSON. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".:$PWD/.vllm/tree" KDA_VLLM_CACHE="$PWD/.vllm" NO_COLOR=1 PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT to the folder that receives the results}"
MODULE=vllm.models.kimi_k3.nvidia.ops.recoverssm
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"

if [ "${SUITE:?set SUITE to tests or bench}" = tests ]; then
    timeout -s TERM 300 python3 -m pytest -q -x tests/test_vllm_release.py tests/test_record_exact_calls.py \
        2>&1 | tee "$OUT/pytest-release.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout -s TERM 200 python3 -m pytest -q -x -m gpu tests/test_commit_layers.py 2>&1 | tail -3 \
        | tee -a "$OUT/pytest-release.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    for config in "8 fp32 --graphs" "8 bf16 --graphs --align" "4 fp32 --graphs --align --conv-dim-first" \
                  "4 bf16 --graphs" "8 fp32 --align" "8 bf16 --conv-dim-first"; do
        read -r T dtype flags <<< "$config"
        trace="/tmp/release-T$T-$dtype-${flags// /}.safetensors"
        dim_first=0
        [[ "$flags" == *--conv-dim-first* ]] && dim_first=1
        # shellcheck disable=SC2086  # flags is a list of options
        KDA_VLLM_CONV_DIM_FIRST=$dim_first timeout -s TERM 120 python3 -m kda_cli record run "$trace" \
            --patch "$MODULE" --layers all -- python3 examples/vllm_engine.py --preset k3 --layers 3 \
            --steps 4 --spec-len "$T" --state-dtype "$dtype" $flags > /tmp/record.log 2>&1
        line="T=$T $dtype $flags: record $?"
        for impl in triton reference "$MODULE"; do
            exact=()
            [ "$impl" = "$MODULE" ] && exact=(--atol 0 --rtol 0)
            timeout -s TERM 120 python3 -m kda_cli replay "$trace" --impl "$impl" --no-progress "${exact[@]}" \
                > /tmp/replay.log 2>&1
            code=$?
            [ "$code" -eq 0 ] || status=1
            line="$line; ${impl##*.} $code ($(tail -1 /tmp/replay.log))"
        done
        echo "$line $(python3 -m kda_cli info "$trace" 2>/dev/null | grep -iE 'events|skipped' | tr '\n' ' ')" \
            | tee -a "$OUT/engines.txt"
        rm -f "$trace"
    done
else
    ARGS=(--row-seconds 0.1 --reps 20 --impl "triton,$MODULE")
    timeout -s TERM 150 python3 -m kda_cli bench "${ARGS[@]}" --ops verify --batch 1,8,64,256 \
        --save "$OUT/release-verify-T8.json" || status=1
    for L in 1 24; do
        timeout -s TERM 150 python3 -m kda_cli bench "${ARGS[@]}" --layers "$L" --ops commit-context \
            --batch 1,8,64,256 --save "$OUT/release-commit-context-L$L.json" || status=1
    done
fi
exit "$status"
