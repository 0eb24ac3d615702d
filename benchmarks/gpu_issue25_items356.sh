#!/usr/bin/env bash
# Issue 25's items 6, 3 and 5 on one H200 in one device call (items 1, 2, 4 have their own):
#
#   here:    python3 tests/gpu/make_wheelhouse.py        (fills the git-ignored .whl/)
#   device:  command "bash benchmarks/gpu_issue25_items356.sh", carry [".whl"], timeout_s 330
#            (BUDGET_S=290 by default: the pieces below share it; ~5 minutes in all)
#
# Pieces in this order, each bounded by what is left of the budget less what the later wanted
# pieces need (NEEDS_S); a piece cut short still leaves its log, later ones are skipped when
# nothing is left:
#   1. cli-latency.log   benchmarks/cli_latency.py (hpcrl validate best of 5 against python -c
#                        pass, goal line), then validate's -X importtime top 25 and its
#                        cProfile top 25 (where the time goes if it is still slow)   (~30 s)
#   2. first-step.log    benchmarks/first_step_cache.py: two `hpcrl submit --wait` of the
#                        shipped 1-GPU recipe on local-gpu sharing one compile cache; per run
#                        step 1 and its phases, cache hits/misses, first/steady; GOAL (~150 s)
#   3. 8b-build.log      the Llama-3.1-8B-shaped checkpoint (tiny:llama3.1-8b, bf16, 16 GB)
#                        built on the GPU into /tmp/hpcrl-cache                     (~60 s)
#   4. 8b-megatron.log   hpcrl sweep of grpo-llama3.1-8b-1n1g-megatron over the optimizer
#      8b-megatron.report  offload fraction 0.5, 0, 1.0 (in that order: a likely fit, the
#                        likely OOM, then the slowest, all optimizer steps on the CPU),
#                        $STEPS_8B steps each (default 2), then hpcrl status and report of the
#                        sweep: which points fit (OOM rows with their peak), step time, peak
#                        GPU / host memory
#   5. 8b-automodel.log  (named only) the Automodel 8B sweep over the optimizer offload
#                        fraction (AUTOMODEL_FRACTIONS, default 0.5,1.0,0), $STEPS_8B steps
#                        each; AUTOMODEL_AXES=fsdp-offload: over FSDP's cpu_offload x
#                        activation checkpointing instead; AUTOMODEL_EXTRA: more overrides
#                        for every point (e.g. loss_fn.reference_policy_kl_penalty=0)
#   6. 8b-megatron-ac.log (named only) the Megatron sweep again with activation checkpointing
#   7. gpu-tests.log     (named only) tests/gpu's Automodel end-to-end test (hpcrl submit --wait
#                        on local-gpu) with the installed wheel of this checkout, as
#                        tests/gpu/device_run.sh runs it                             (~110 s);
#                        GPU_TESTS_K picks others (pytest -k), e.g. "automodel or megatron_grpo"
# plus summary.txt, versions.txt (with nvidia-smi and free) and sweeps.tgz (each sweep's
# metrics, causes and status files, no checkpoints) in $OUT: at most 8 files come back.
#
# For the whole of item 5 give it a call of its own:
#   PIECES="8b-build 8b-megatron 8b-automodel" BUDGET_S=560 bash benchmarks/gpu_issue25_items356.sh
#
# SMOKE=1 PYTHON=.venv/bin/python bash benchmarks/gpu_issue25_items356.sh   checks this script
# on a CPU machine: the tiny CPU recipes on the local profile, no install (timings mean nothing).
set -uo pipefail
START_S=$SECONDS
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/hpcrl-issue25-out}
BUDGET_S=${BUDGET_S:-290}
PYTHON=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
ORDER=(cli-latency first-step 8b-build 8b-megatron 8b-automodel 8b-megatron-ac gpu-tests)
PIECES=${PIECES:-cli-latency first-step 8b-build 8b-megatron}
declare -A NEEDS_S=([cli-latency]=30 [first-step]=120 [8b-build]=60 [8b-megatron]=60
                    [8b-automodel]=120 [8b-megatron-ac]=120 [gpu-tests]=110)
STEPS_8B=${STEPS_8B:-2}  # GRPO steps per 8B point: the first steps tell the memory boundary
wanted() { [[ " $PIECES " == *" $1 "* ]]; }
for piece in $PIECES; do
    [ -n "${NEEDS_S[$piece]:-}" ] || { echo "unknown piece $piece (one of ${ORDER[*]})"; exit 2; }
done

mkdir -p "$OUT"
cd "$REPO" || exit 1
if [ "$SMOKE" != 1 ]; then
    if [ ! -d /tmp/site/ray ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$REPO"/.whl/*.whl || exit 1
    fi
    export PYTHONPATH="$REPO:/tmp/site"  # the checkout's hpcrl, in this shell and in the jobs
    CLUSTER=local-gpu
    RECIPE_8B=grpo-llama3.1-8b-1n1g
    MODEL_8B=${MODEL_8B:-tiny:llama3.1-8b}  # e.g. tiny:llama3.2-3b for one H100
    FIRST_STEP_ARGS=(--steps 5)
else
    export PYTHONPATH="$REPO"
    CLUSTER=local
    RECIPE_8B=grpo-tiny-1n-cpu  # SMOKE: the CPU demo stands in for both 8B recipes
    MODEL_8B=tiny:qwen2
    FIRST_STEP_ARGS=(--tiny)
fi
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 HPCRL_CACHE=/tmp/hpcrl-cache
export PYTHON SMOKE CLUSTER RECIPE_8B MODEL_8B STEPS_8B REPO MEGATRON_DIR=/tmp/hpcrl-megatron
export AUTOMODEL_FRACTIONS="${AUTOMODEL_FRACTIONS:-0.5,1.0,0}" AUTOMODEL_AXES="${AUTOMODEL_AXES:-fraction}"
export AUTOMODEL_ZIP="${AUTOMODEL_ZIP:-0}" AUTOMODEL_EXTRA="${AUTOMODEL_EXTRA:-}"
if [ "$SMOKE" != 1 ]; then  # a GPU process left by an earlier call on this machine, by id
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
        echo "stopping GPU process $pid left by an earlier call"; kill -KILL "$pid"
    done
fi
rm -rf /tmp/first-step /tmp/sweep-8b-megatron /tmp/sweep-8b-automodel /tmp/sweep-8b-megatron-ac

{ nvidia-smi; free -g; df -h /tmp; } > "$OUT/versions.txt" 2>&1
"$PYTHON" - <<'PY' 2>&1 | tee -a "$OUT/versions.txt"
import importlib.metadata as md, os, sys
print("python", sys.version.split()[0], "| PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"))
for name in ("torch", "transformers", "triton", "ray", "megatron-core", "megatron-bridge"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
PY

left_s() { echo $((BUDGET_S - (SECONDS - START_S))); }
reserve_after() {
    local total=0 later=0 piece
    for piece in "${ORDER[@]}"; do
        [ "$later" = 1 ] && wanted "$piece" && total=$((total + NEEDS_S[$piece]))
        [ "$piece" = "$1" ] && later=1
    done
    echo "$total"
}
at_most() {
    local left=$(( $(left_s) - $(reserve_after "$2") ))
    [ "$left" -gt "$1" ] && left=$1
    echo "$left"
}
# bounded SECONDS LOG CMD...: CMD in a session of its own (its output in LOG and on stdout),
# stopped with everything it started (Ray, the jobs) after SECONDS.
bounded() {
    local limit=$1 log=$2
    shift 2
    if [ "$limit" -lt 20 ]; then
        echo "== skipped (budget spent): $*" | tee "$log"
        return 124
    fi
    echo "== $(date +%T) up to ${limit}s: $*" | tee "$log"
    local started=$SECONDS
    # a new bash: the pieces are exported functions as well as commands
    setsid bash -c '"$@"' piece "$@" >> "$log" 2>&1 &
    local pid=$!
    tail -n +2 -f "$log" --pid "$pid" &
    local tailer=$!
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - started)) -lt "$limit" ]; do
        sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "== stopped after ${limit}s" >> "$log"
        kill -TERM -- "-$pid" 2>/dev/null
        sleep 5
    fi
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid"
    local status=$?
    wait "$tailer" 2>/dev/null
    echo "== exit $status after $((SECONDS - started))s" | tee -a "$log"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$log" 2>&1
    return "$status"
}
# a sweep's status and report into LOG (also after a sweep cut short: the finished points)
sweep_report() {
    local sweep=$1 log=$2
    [ -f "$sweep/sweep.json" ] || return 0
    { "$PYTHON" -m hpcrl.cli.main status "$sweep"; "$PYTHON" -m hpcrl.cli.main report "$sweep"
      "$PYTHON" -m hpcrl.cli.main report "$sweep" --json; } > "$log" 2>&1
    cat "$log"
}
cli_latency() {
    "$PYTHON" benchmarks/cli_latency.py --torch-repeats 1
    local here=/tmp/validate-where
    mkdir -p "$here" && cd "$here" || return 1
    echo "== -X importtime, top 25 by cumulative time"
    "$PYTHON" -X importtime -m hpcrl.cli.main validate grpo-tiny-1n-cpu --cluster local \
        2>&1 >/dev/null | sort -t'|' -k2 -n | tail -25
    echo "== cProfile, top 25 by cumulative time"
    "$PYTHON" -m cProfile -s cumtime -m hpcrl.cli.main validate grpo-tiny-1n-cpu \
        --cluster local 2>&1 | grep -A 27 "Ordered by" | cut -c1-150
}
build_8b() {
    "$PYTHON" -c "import time; from hpcrl.core.models.tiny import ensure_tiny_model as e; \
t = time.time(); print('built', e('$MODEL_8B'), f'in {time.time() - t:.0f} s')"
}
export OPT=policy.megatron_cfg.optimizer
megatron_sweep() {  # SWEEP_DIR [extra args]
    local sweep=$1
    shift
    # MEGATRON_FRACTIONS picks the points (default 0.5,0,1.0); offload is on for every
    # fraction but 0 (megatron-core refuses a 0 fraction with the offload on)
    local fractions=${MEGATRON_FRACTIONS:-0.5,0,1.0} offload_list=() offloads fraction
    for fraction in ${fractions//,/ }; do
        [ "$fraction" = 0 ] && offload_list+=(false) || offload_list+=(true)
    done
    offloads=$(IFS=,; echo "${offload_list[*]}")
    local backend_args=(--zip "$OPT.optimizer_cpu_offload=$offloads"
                        --zip "$OPT.optimizer_offload_fraction=$fractions"
                        "policy.megatron_cfg.env_vars.NRL_MEGATRON_CHECKPOINT_DIR=$MEGATRON_DIR")
    local recipe="$RECIPE_8B-megatron"
    [ "$SMOKE" = 1 ] && { recipe=grpo-tiny-1n-cpu; backend_args=(--grid "grpo.seed=1,2"); }
    "$PYTHON" -m hpcrl.cli.main sweep "$recipe" --cluster "$CLUSTER" -o "$sweep" --wait \
        "${backend_args[@]}" "policy.model_name=$MODEL_PATH" "grpo.max_num_steps=$STEPS_8B" "$@"
}
automodel_sweep() {
    # the optimizer offload fraction (hpcrl's policy.automodel_cfg.optimizer_offload_fraction:
    # AdamW's state of that share of the parameters in host memory, stepped there), in the
    # order AUTOMODEL_FRACTIONS gives (default: the likely fits first, then the known OOM)
    local axes=(--zip "policy.automodel_cfg.optimizer_offload_fraction=${AUTOMODEL_FRACTIONS:-0.5,1.0,0}")
    # AUTOMODEL_AXES=fsdp-offload: the earlier sweep over FSDP's cpu_offload x activation
    # checkpointing; AUTOMODEL_ZIP=1 with it: three of its four points
    if [ "${AUTOMODEL_AXES:-fraction}" = fsdp-offload ]; then
        axes=(--grid "policy.automodel_cfg.cpu_offload=false,true"
              --grid "policy.automodel_cfg.activation_checkpointing=false,true")
        [ "${AUTOMODEL_ZIP:-0}" = 1 ] && axes=(
            --zip "policy.automodel_cfg.cpu_offload=false,false,true"
            --zip "policy.automodel_cfg.activation_checkpointing=false,true,true")
    fi
    local recipe="$RECIPE_8B-automodel"
    [ "$SMOKE" = 1 ] && { recipe=grpo-tiny-1n-cpu; axes=(--zip "policy.automodel_cfg.optimizer_offload_fraction=0.5,1.0"); }
    "$PYTHON" -m hpcrl.cli.main sweep "$recipe" --cluster "$CLUSTER" -o /tmp/sweep-8b-automodel \
        --wait "${axes[@]}" "policy.model_name=$MODEL_PATH" "grpo.max_num_steps=$STEPS_8B" \
        ${AUTOMODEL_EXTRA:-}
}
gpu_tests() {  # tests/gpu's Automodel test, as tests/gpu/device_run.sh runs it
    [ "$SMOKE" = 1 ] && { echo "SMOKE: tests/gpu needs a GPU"; return 0; }
    cd /tmp || return 1
    PYTHONPATH=/tmp/site HPCRL_REQUIRE_GPU=1 HPCRL_GPU_TEST_OUT=/tmp/hpcrl-gpu-runs \
        "$PYTHON" -m pytest -p no:cacheprovider -s -v -rfEs --timeout=900 "$REPO/tests/gpu" \
        -k "${GPU_TESTS_K:-automodel or wheel or documented}"
}

export -f cli_latency build_8b megatron_sweep automodel_sweep gpu_tests

# 1. login-node latency
wanted cli-latency && bounded "$(at_most 60 cli-latency)" "$OUT/cli-latency.log" cli_latency

# 2. first step with a warm compile cache
wanted first-step && bounded "$(at_most 240 first-step)" "$OUT/first-step.log" "$PYTHON" \
    benchmarks/first_step_cache.py "${FIRST_STEP_ARGS[@]}" --cluster "$CLUSTER" --out-dir /tmp/first-step
# a kept compilation whose guards refused its calls: the failing guard, from the workers' logs
wanted first-step && grep -rhoE "[a-z_]+: the kept compilation [^ ]+ refuses the call it was kept for.{0,400}" \
    /tmp/first-step 2>/dev/null | sort | uniq -c | head -5 | sed 's/^/REFUSED /' >> "$OUT/first-step.log"

# 3.-6. the 8B model and its sweeps
wanted 8b-build && bounded "$(at_most 150 8b-build)" "$OUT/8b-build.log" build_8b
MODEL_PATH=$(sed -n 's/^built \(.*\) in .*/\1/p' "$OUT/8b-build.log" 2>/dev/null)
export MODEL_PATH=${MODEL_PATH:-$MODEL_8B}
wanted 8b-megatron && bounded "$(at_most 900 8b-megatron)" "$OUT/8b-megatron.log" \
    megatron_sweep /tmp/sweep-8b-megatron
wanted 8b-megatron && sweep_report /tmp/sweep-8b-megatron "$OUT/8b-megatron.report"
wanted 8b-automodel && bounded "$(at_most 900 8b-automodel)" "$OUT/8b-automodel.log" automodel_sweep
wanted 8b-automodel && sweep_report /tmp/sweep-8b-automodel "$OUT/8b-automodel.report"
wanted 8b-megatron-ac && bounded "$(at_most 900 8b-megatron-ac)" "$OUT/8b-megatron-ac.log" \
    megatron_sweep /tmp/sweep-8b-megatron-ac policy.megatron_cfg.activation_checkpointing=true
wanted 8b-megatron-ac && sweep_report /tmp/sweep-8b-megatron-ac "$OUT/8b-megatron-ac.report"
wanted gpu-tests && bounded "$(at_most 240 gpu-tests)" "$OUT/gpu-tests.log" gpu_tests

# every sweep's and run's small files (metrics, causes, status, logs), no checkpoints
( cd /tmp && find sweep-8b-* first-step hpcrl-gpu-runs -type f -size -20M \
      \( -name '*.json*' -o -name '*.log' -o -name '*.out' -o -name '*.err' -o -name '*.txt' \
         -o -name '*.yaml' \) 2>/dev/null | tar czf "$OUT/sweeps.tgz" -T - )

{
    for piece in "${ORDER[@]}"; do
        wanted "$piece" || continue
        echo "===== $piece"
        grep -E "^(GOAL|hpcrl validate|run [12] |first step|built|REFUSED|== (exit|stopped|skipped))|out of GPU memory|Traceback|Error" \
            "$OUT/$piece.log" 2>/dev/null | head -40
        # the status and report tables (the JSON after them stays in the .report file)
        [ -f "$OUT/$piece.report" ] && sed '/^{/,$d' "$OUT/$piece.report" | head -60
    done
    echo "total ${SECONDS}s"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
ls -la "$OUT"
