#!/usr/bin/env bash
# The GPU runs, one named suite a device call (each under ten minutes: every step has a time
# limit of its own):
#
#   benchmarks/run.sh SUITE [ARG]
#
#   tests           the whole `pytest -m gpu` (pytest-gpu.txt)
#   check           a change's check: `pytest -m gpu`, stopping at the first failure or at a
#                   test past 120 s (pytest-gpu.txt)
#   check-bench     its benches: k3-tp8, T=8 and 4, B=1,8,64,256, verify, commit, flush-verify
#                   and both decode steps (bench-T8.json, bench-T4.json)
#   final           the shipped kernels' numbers: the k3-tp8 sweeps at T=8 and 4
#                   (bench-k3-tp8-T*.json), the engine's commit at L=24 and 1, kda's context
#                   beside the example module's (bench-context-L*.json), the whole
#                   `pytest -m gpu` (pytest-gpu.txt); the benches' progress in bench.log
#   full            the sweeps at T=8 (B=2-4 added) and T=4, against plain stream order, over
#                   the sample trace, then a 64-request k3-tp8 trace synthesised and replayed
#                   through triton and the reference (its tests are the suite `tests`)
#   acceptance      the seed's kernels compiled, the sweeps at T=8 and 4, 24 layers' commit at
#                   T=4, a 50-trace corpus through a pool worker against a loop, the example
#                   engine in CUDA graphs recorded unedited and replayed (engine-*.txt)
#   commit-context  the commit contexts' tests, `kda bench` of commit-layers and commit-context
#                   (T=8 and 4, L=1 and 24) kda's beside the example module's, the example
#                   engine with --commit context --graphs
#   layers          the commit-layers tests, a model of L=1 and 24 layers (commit, commit-layers,
#                   step-stock) under the table, then with every commit of all layers in one
#                   launch (--design commit-layers=one-launch, compared with the first)
#   designs         the design review: each kept design beside its next simpler one
#   commit-variant VARIANT
#                   a commit variant (benchmarks/variants/NAME.py, or OP=DESIGN forced through
#                   --design) beside the shipped commit: the commit-context, recording and
#                   trace tests under the table and under it, then commit-layers and
#                   commit-context at L=24 and 1 (BATCHES, default 1,8,32,64,256)
#   release-tests   the released vLLM 0.33.0 module's tests compiled and its engines at K3
#                   shapes recorded with --patch and replayed through triton, the reference and
#                   the release itself, bit for bit (engines.txt)
#   release-bench   kda bench --impl triton,MODULE: verify at T=8 and the commit context at
#                   L=1 and 24, B=1,8,64,256
#   regression RUN  a change that moves no kernel's code, against an earlier release-bench run
#                   (a folder of results/): the whole `pytest -m gpu` (on 6 workers where
#                   pytest-xdist is importable), the release's tests, then release-bench's
#                   verify and L=24 commit context with --compare against RUN's files
#
# The release suites take the module from the tree tests/support/vllm_release.py lays, copied into the
# ignored folder .vllm/ and carried (KDA_VLLM_CACHE=.vllm). BENCH_ARGS replaces the sampling
# options of check-bench and acceptance (default "--row-seconds 0.15 --reps 30") and adds
# options to full's benches.
# Each run writes to $OUT/DATE-SUITE-DEVICE/ (OUT defaults to benchmarks/results) beside its
# manifest.json: the commit (COMMIT, else git's HEAD), the device, the command, each step's
# exit status and the files.
# Runs from a plain checkout: PYTHONPATH is the repository root, absolute (a bundle's repro.sh
# runs in another folder), ahead of the caller's. Exit status: non-zero if a step failed or
# ran out of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NO_COLOR=1 PYTHONUNBUFFERED=1
SUITES=" tests regression check check-bench final full acceptance commit-context layers designs commit-variant release-tests release-bench "
SUITE="${1:?name a suite (benchmarks/run.sh lists them)}"
shift
if [[ "$SUITES" != *" $SUITE "* ]]; then
    echo "benchmarks/run.sh: unknown suite $SUITE (one of:$SUITES)" >&2
    exit 2
fi
ARGS=("$@")
SAMPLING="${BENCH_ARGS:---row-seconds 0.15 --reps 30}"
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
DEVICE_DETAILS=$(nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
DEVICE=${DEVICE_DETAILS%%,*}
case "$DEVICE" in
    *H200*) SLUG=h200 ;;
    *H100*) SLUG=h100 ;;
    "") SLUG=cpu ;;
    *) SLUG=$(echo "$DEVICE" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-') ;;
esac
RUN="${OUT:-benchmarks/results}/$(date -u +%F)-$SUITE-$SLUG"
mkdir -p "$RUN"
STEPS=()
status=0
exec 3>&1  # the run's own lines, wherever a step's output goes

note() {  # note STEP RC: print a step's exit status, remember it
    echo "$1: exit $2" >&3
    STEPS+=("$2 $1")
    [ "$2" -eq 0 ] || status=1
}

step() {  # step NAME SECONDS COMMAND...: the command under a time limit
    local name=$1 limit=$2
    shift 2
    timeout -s TERM "$limit" "$@"
    note "$name" $?
}

logged() {  # logged NAME SECONDS FILE COMMAND...: the same, its output to $RUN/FILE, the tail shown
    local name=$1 limit=$2 file=$3
    shift 3
    timeout -s TERM "$limit" "$@" > "$RUN/$file" 2>&1
    local rc=$?
    tail -n 3 "$RUN/$file"
    note "$name" "$rc"
}

sweep() {  # sweep NAME SECONDS T BATCHES FILE [BENCH-ARGS...]: k3-tp8 over the ops and steps of a change's check
    local name=$1 limit=$2 T=$3 batches=$4 file=$5
    shift 5
    # shellcheck disable=SC2086  # SAMPLING is a list of options
    step "$name" "$limit" python3 -m kda_cli bench --spec-len "$T" --batch "$batches" \
        --ops verify,commit,flush-verify,step-stock,step-deferred $SAMPLING --force --save "$RUN/$file" "$@"
}

suite_tests() {
    logged "pytest -m gpu" 330 pytest-gpu.txt python3 -m pytest -m gpu -q -p no:cacheprovider
}

suite_regression() {
    local baseline="${ARGS[0]:?name the earlier release-bench run (a folder of benchmarks/results)}" workers=()
    python3 -c "import xdist" 2> /dev/null && workers=(-n 6)
    release_env
    logged "pytest -m gpu" 240 pytest-gpu.txt python3 -m pytest -m gpu -q -p no:cacheprovider "${workers[@]}"
    logged "release tests" 120 pytest-release.txt python3 -m pytest -q -p no:cacheprovider \
        tests/traces/impl/test_vllm_release.py tests/traces/record/test_record_exact_calls.py
    local sampling=(--row-seconds 0.1 --reps 20 --impl "triton,$RELEASE" --batch 1,8,64,256)
    step "release verify" 90 python3 -m kda_cli bench "${sampling[@]}" --ops verify \
        --compare "$baseline/release-verify-T8.json" --save "$RUN/release-verify-T8.json"
    step "release commit-context L=24" 90 python3 -m kda_cli bench "${sampling[@]}" --layers 24 \
        --ops commit-context --compare "$baseline/release-commit-context-L24.json" \
        --save "$RUN/release-commit-context-L24.json"
}

suite_check() {
    logged "pytest -m gpu -x" 420 pytest-gpu.txt python3 -m pytest -m gpu -q -x --timeout=120
}

suite_check_bench() {
    for T in 8 4; do
        sweep "bench T=$T" 90 "$T" 1,8,64,256 "bench-T$T.json"
    done
}

suite_final() {
    SAMPLING="--row-seconds 0.12 --reps 25"
    for T in 8 4; do
        sweep "bench k3-tp8 T=$T" 90 "$T" 1,2,4,8,64,128,256 "bench-k3-tp8-T$T.json" 2>> "$RUN/bench.log"
    done
    for run in "24 1,8,16,32,64,256" "1 1,8,64,256"; do
        read -r L batches <<< "$run"
        step "bench context L=$L" 170 python3 -m kda_cli bench --spec-len 8,4 --batch "$batches" --layers "$L" \
            --ops commit,commit-layers,commit-context --impl triton,examples/recoverssm_module.py \
            --row-seconds 0.12 --reps 20 --force --save "$RUN/bench-context-L$L.json" 2>> "$RUN/bench.log"
    done
    suite_tests
}

suite_full() {
    local logs trace
    logs=$(mktemp -d)
    step "kda version" 15 python3 -m kda_cli version --format json > "$RUN/environment.json"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    step "bench T=8" 170 python3 -m kda_cli bench --spec-len 8 --batch 1,2,3,4,8,32,64,128,256 --force \
        --save "$RUN/bench-k3-tp8-T8.json" ${BENCH_ARGS:-} 2> "$logs/bench-T8.log"
    # shellcheck disable=SC2086
    step "bench T=4" 110 python3 -m kda_cli bench --spec-len 4 --force --save "$RUN/bench-k3-tp8-T4.json" \
        ${BENCH_ARGS:-} 2> "$logs/bench-T4.log"
    # shellcheck disable=SC2086
    step "bench plain stream order" 130 python3 -m kda_cli bench --spec-len 8 \
        --ops verify,commit,step-stock,step-deferred --impl triton,benchmarks/variants/plain_order.py --force \
        --save "$RUN/bench-dependent-launch.json" ${BENCH_ARGS:-} 2> "$logs/bench-dependent.log"
    # shellcheck disable=SC2086
    step "bench sample trace" 50 python3 -m kda_cli bench --trace traces/samples/k3-tp8-sample.safetensors --force \
        --save "$RUN/bench-trace-sample.json" ${BENCH_ARGS:-} > "$logs/bench-trace.txt" 2> "$logs/bench-trace.log"
    trace="$logs/k3-tp8-64req.safetensors"
    step synth 20 python3 -m kda_cli synth "$trace" --force --preset k3-tp8 --mode mixed --requests 64 \
        --max-batch 8 --seed 1 > /dev/null
    for impl in triton reference; do
        step "replay $impl" 45 python3 -m kda_cli replay "$trace" --impl "$impl" --format json \
            > "$RUN/replay-k3-$impl.json"
    done
    python3 - "$RUN" <<'PY'
import json, sys
for impl in ("triton", "reference"):
    try:
        r = json.load(open(f"{sys.argv[1]}/replay-k3-{impl}.json"))
    except (OSError, ValueError):
        continue
    ops = {op: (s["events"], s["median_ms"]) for op, s in r["summary"].items()}
    print(f"replay {impl}: passed={r['passed']} events={len(r['events'])} (events, median ms) per op: {ops}")
PY
}

suite_acceptance() {
    local trace
    logged "seed kernels" 120 pytest-seed.txt python3 -m pytest -m gpu -q tests/kernels/test_seed_kernels.py
    for T in 8 4; do
        sweep "bench T=$T" 130 "$T" 1,2,4,8,64,128,256 "bench-k3-tp8-T$T.json"
    done
    step "24 layers, T=4" 70 python3 -m kda_cli bench --spec-len 4 --batch 1,8,64,256 --layers 24 \
        --ops commit,commit-layers,step-stock --row-seconds 0.1 --reps 20 --force --save "$RUN/bench-layers-L24-T4.json"
    logged corpus 100 corpus-overhead.txt python3 benchmarks/corpus_overhead.py --traces 50 --impl triton
    trace=$(mktemp -d)/engine-graphs.safetensors
    logged "engine in graphs" 60 engine-plain.txt python3 examples/serve_engine.py --graphs --preset k3 --mode mixed
    step "engine recorded" 90 python3 -m kda_cli record run "$trace" --patch examples.recoverssm_module --format json \
        -- python3 examples/serve_engine.py --graphs --preset k3 --mode mixed > "$RUN/engine-record.json" \
        2> "$RUN/engine-record-stderr.txt"
    python3 -m kda_cli info "$trace" > "$RUN/engine-info.txt" 2>&1
    logged "engine replayed" 90 engine-replay.txt python3 -m kda_cli replay "$trace" --impl triton --no-progress
}

suite_commit_context() {
    logged "context tests" 120 pytest-commit-context.txt python3 -m pytest -q tests/kernels/test_commit_layers.py \
        tests/examples/test_example_engine.py tests/traces/bench/test_bench.py \
        -k "example_module or conv_window_bug or context or conv_update"
    for T in 8 4; do
        for L in 1 24; do
            step "bench L=$L T=$T" 90 python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 --layers "$L" \
                --row-seconds 0.5 --ops commit-layers,commit-context --impl triton,examples/recoverssm_module.py \
                --force --save "$RUN/bench-context-L$L-T$T.json"
        done
    done
    step "engine, commit context" 60 python3 examples/serve_engine.py --commit context --graphs --preset k3 \
        --layers 4 --steps 8
}

suite_layers() {
    logged "commit-layers tests" 60 pytest-commit-layers.txt python3 -m pytest -m gpu -q \
        tests/kernels/test_commit_layers.py
    for T in 8 4; do
        for L in 1 24; do
            step "bench L=$L T=$T" 65 python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 --layers "$L" \
                --ops commit,commit-layers,step-stock --force --save "$RUN/bench-layers-L$L-T$T.json"
            step "bench L=$L T=$T, one launch" 65 python3 -m kda_cli bench --spec-len "$T" --batch 1,8,64,256 \
                --layers "$L" --ops commit,commit-layers,step-stock --design commit-layers=one-launch \
                --compare "$RUN/bench-layers-L$L-T$T.json" --force --save "$RUN/bench-layers-L$L-T$T-one-launch.json"
        done
    done
}

suite_designs() {
    local v=benchmarks/variants sampling=(--row-seconds 0.15 --reps 30)
    group() {  # group NAME SECONDS BENCH-ARGS...: one bench saved to designs-NAME.json, its log beside it
        local name=$1 limit=$2
        shift 2
        step "designs $name" "$limit" python3 -m kda_cli bench "$@" "${sampling[@]}" --force \
            --save "$RUN/designs-$name.json" 2> "$RUN/designs-$name.log"
    }
    group small 180 --spec-len 4,8 --batch 1,2,4,8,16,32 --ops verify,commit,flush-verify,step-stock,step-deferred \
        --impl "triton,$v/uniform_register_budget.py,$v/plain_order.py"
    group no-flush-apart 80 --spec-len 4,8 --batch 1,2,4,8 --ops flush-verify,step-deferred \
        --design flush-verify=token-loop-token-by-token --compare "$RUN/designs-small.json"
    group verify-two-kernels 80 --spec-len 4,8 --batch 1,2,4,8,16,32 --ops verify,step-stock \
        --design verify=two-kernels --compare "$RUN/designs-small.json"
    group large 200 --spec-len 4,8 --batch 64,128,256 --ops verify,commit,flush-verify,step-stock,step-deferred \
        --impl "triton,$v/no_flush_register_caps.py,$v/plain_order.py"
}

suite_commit_variant() {
    local variant="${ARGS[0]:?name a variant: benchmarks/variants/NAME.py or OP=DESIGN}" name forced tests
    tests=(tests/kernels/test_commit_layers.py tests/traces/record/test_record_layers.py
        tests/traces/format/test_trace_v2.py)
    if [[ "$variant" == *=* ]]; then
        name=${variant//[=,]/-}
        forced=(env "KDA_DESIGN=$variant" timeout -s TERM 150 python3 -m pytest)
    else
        name=$(basename "$variant" .py)
        forced=(env "KDA_VARIANT=$variant" timeout -s TERM 150 python3 -m pytest -p benchmarks.variants.forced)
    fi
    logged "pytest (the table's designs)" 150 pytest-tables.txt python3 -m pytest -m gpu -q -p no:cacheprovider \
        "${tests[@]}"
    "${forced[@]}" -m gpu -q -p no:cacheprovider -k "not until_a_layer" "${tests[@]}" > "$RUN/pytest-$name.txt" 2>&1
    local rc=$?
    tail -n 2 "$RUN/pytest-$name.txt"
    note "pytest ($name)" "$rc"
    for L in 24 1; do
        local bench=(python3 -m kda_cli bench --spec-len 8,4 --batch "${BATCHES:-1,8,32,64,256}" --layers "$L"
                     --ops commit-layers,commit-context --row-seconds 0.12 --reps 20 --force)
        if [[ "$variant" == *=* ]]; then
            step "bench L=$L" 75 "${bench[@]}" --save "$RUN/tables-L$L.json" 2> /dev/null
            step "bench L=$L ($name)" 75 "${bench[@]}" --design "$variant" --compare "$RUN/tables-L$L.json" \
                --save "$RUN/$name-L$L.json" 2> /dev/null
        else
            step "bench L=$L" 150 "${bench[@]}" --impl "triton,$variant" --save "$RUN/$name-L$L.json" 2> /dev/null
        fi
    done
}

RELEASE=vllm.models.kimi_k3.nvidia.ops.recoverssm

release_env() {
    export PYTHONPATH="$PYTHONPATH:$PWD/.vllm/tree" KDA_VLLM_CACHE="$PWD/.vllm"
}

suite_release_tests() {
    local config T dtype flags trace dim_first line impl exact code engines=0
    release_env
    logged "release tests" 300 pytest-release.txt python3 -m pytest -q -x tests/traces/impl/test_vllm_release.py \
        tests/traces/record/test_record_exact_calls.py
    timeout -s TERM 200 python3 -m pytest -q -x -m gpu tests/kernels/test_commit_layers.py 2>&1 | tail -n 3 \
        | tee -a "$RUN/pytest-release.txt"
    note "context tests" "${PIPESTATUS[0]}"
    for config in "8 fp32 --graphs" "8 bf16 --graphs --align" "4 fp32 --graphs --align --conv-dim-first" \
                  "4 bf16 --graphs" "8 fp32 --align" "8 bf16 --conv-dim-first"; do
        read -r T dtype flags <<< "$config"
        trace="/tmp/release-T$T-$dtype-${flags// /}.safetensors"
        dim_first=0
        [[ "$flags" == *--conv-dim-first* ]] && dim_first=1
        # shellcheck disable=SC2086  # flags is a list of options
        KDA_VLLM_CONV_DIM_FIRST=$dim_first timeout -s TERM 120 python3 -m kda_cli record run "$trace" \
            --patch "$RELEASE" --layers all -- python3 examples/vllm_engine.py --preset k3 --layers 3 \
            --steps 4 --spec-len "$T" --state-dtype "$dtype" $flags > /tmp/record.log 2>&1
        line="T=$T $dtype $flags: record $?"
        for impl in triton reference "$RELEASE"; do
            exact=()
            [ "$impl" = "$RELEASE" ] && exact=(--atol 0 --rtol 0)
            timeout -s TERM 120 python3 -m kda_cli replay "$trace" --impl "$impl" --no-progress "${exact[@]}" \
                > /tmp/replay.log 2>&1
            code=$?
            [ "$code" -eq 0 ] || engines=1
            line="$line; ${impl##*.} $code ($(tail -1 /tmp/replay.log))"
        done
        echo "$line $(python3 -m kda_cli info "$trace" 2>/dev/null | grep -iE 'events|skipped' | tr '\n' ' ')" \
            | tee -a "$RUN/engines.txt"
        rm -f "$trace"
    done
    note "engines recorded and replayed" "$engines"
}

suite_release_bench() {
    local sampling=(--row-seconds 0.1 --reps 20 --impl "triton,$RELEASE")
    release_env
    step "release verify" 150 python3 -m kda_cli bench "${sampling[@]}" --ops verify --batch 1,8,64,256 \
        --save "$RUN/release-verify-T8.json"
    for L in 1 24; do
        step "release commit-context L=$L" 150 python3 -m kda_cli bench "${sampling[@]}" --layers "$L" \
            --ops commit-context --batch 1,8,64,256 --save "$RUN/release-commit-context-L$L.json"
    done
}

write_manifest() {  # the run's manifest.json: commit, device, command, steps, files
    python3 - "$RUN" "$SUITE" "$STARTED" "$DEVICE" "$DEVICE_DETAILS" "$status" \
        "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}" "benchmarks/run.sh $SUITE ${ARGS[*]:-}" \
        "${STEPS[@]}" <<'PY'
import json, os, sys
from datetime import datetime, timezone
run, suite, started, device, details, status, commit, command, *steps = sys.argv[1:]
manifest = {
    "run": os.path.basename(run), "commit": commit or None, "date": started[:10], "device": device or None,
    "device_details": details or None, "suite": suite, "command": command.strip(), "started": started,
    "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "exit_status": int(status),
    "steps": [{"step": s.partition(" ")[2], "exit": int(s.partition(" ")[0])} for s in steps],
    "files": sorted(f for f in os.listdir(run) if f != "manifest.json"),
}
with open(os.path.join(run, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
print(f"{run}/manifest.json: {len(manifest['files'])} files, exit {status}")
PY
}

"suite_${SUITE//-/_}"
write_manifest
exit "$status"
