#!/usr/bin/env bash
# Issue 25's GPU measurements (items 1, 2, 4) on one H200 in one device call:
#
#   here:    python3 tests/gpu/make_wheelhouse.py        (fills the git-ignored .whl/)
#   device:  command "bash benchmarks/gpu_issue25.sh", carry [".whl"], timeout_s 590
#            or 'PIECES="train generation" bash benchmarks/gpu_issue25.sh'
#
# Pieces, in this order, each bounded by what is left of BUDGET_S less what the later wanted
# pieces need (NEEDS_S); a piece cut short keeps its log:
#   attention       benchmarks/attention_backends.py: causal SDPA fwd+bwd per backend at the
#                   train shapes                                                    (~20 s)
#   train           benchmarks/train_throughput.py --skip-megatron, loops $TRAIN_LOOPS
#                   (default backend, plain, plain-bf16-residual), alternating rounds, GOAL lines,
#                   with PROFILE=1 a profile summary per loop                      (~150 s)
#   kernels         benchmarks/decode_attention_kernels.py --kinds $KERNEL_KINDS (default,dot):
#                   the decode attention's launches in CUDA graphs; the fastest tensor-core
#                   launch over both batches then runs in the engine as the generation
#                   piece's row hpcrl-launch                                         (~90 s)
#   steps           benchmarks/decode_step_launches.py: the engine's whole decode step per
#                   launch (every layer's cache, CUDA graphs, the buckets of a generate);
#                   its fastest launches (over both batches, then per batch) run in the
#                   engine as rows hpcrl-launch, hpcrl-launch2, ...                  (~150 s)
#   generation      benchmarks/generation_throughput.py, rows $GEN_ROWS (default hpcrl,
#                   hf-static: the configuration that ran at batch 256 in earlier sessions;
#                   two calls with a Triton-attention row in the process segfaulted at 256,
#                   docs/performance.md), batches 64 and 256, self-checks, alternating rounds,
#                   GOAL lines (>= 1.5x hf-static; >= 40% of the weights+KV bound), with
#                   PROFILE=1 a profile summary per hpcrl row and batch at the end  (~170 s)
#   generation-triton  (only when named) the Triton decode attention row against the default,
#                   --no-self-checks, in a process of its own after the main rows   (~60 s)
#   grpo-automodel  benchmarks/grpo_step.py on the shipped 1-GPU Automodel recipe, 8 steps;
#                   with PROFILE=1 the 4th pass of each kind profiled (HPCRL_PROFILE_PASSES:
#                   that step is then slow, the no-stall line means nothing)        (~80 s)
#   grpo-megatron   the same on the shipped 1-GPU Megatron recipe (its HF -> Megatron
#                   conversion included), then the GOAL line Megatron / Automodel step
#                                                                                  (~150 s)
# $OUT gets: one log per piece, summary.txt (the GOAL / BOUND lines, the tables' tails),
# profiles.tgz (every profile summary, both GRPO runs' metrics.jsonl), versions.txt.
#
# SMOKE=1 PYTHON=.venv/bin/python bash benchmarks/gpu_issue25.sh   checks this script on a CPU
# machine: no install, every benchmark on its tiny CPU setting (timings mean nothing).
set -uo pipefail
START_S=$SECONDS
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/hpcrl-issue25-out}
BUDGET_S=${BUDGET_S:-560}
PYTHON=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
ORDER=(attention train kernels steps generation generation-triton grpo-automodel grpo-megatron)
PIECES=${PIECES:-attention train generation grpo-automodel grpo-megatron}
TRAIN_LOOPS=${TRAIN_LOOPS:-backend,plain,plain-bf16-residual}
GEN_ROWS=${GEN_ROWS:-hpcrl,hf-static}
KERNEL_KINDS=${KERNEL_KINDS:-default,dot}  # benchmarks/decode_attention_kernels.py --kinds
PROFILE=${PROFILE:-0}  # 1: torch.profiler summaries (train, generation, the GRPO passes)
# GEN_EXTRA="--no-self-checks": skip the shipped engine's greedy/log-prob/sync self-checks
# (~30 s; every row still checks its sampled log-probs against a teacher-forced forward)
GRPO_STEPS=${GRPO_STEPS:-8}
wanted() { [[ " $PIECES " == *" $1 "* ]]; }
declare -A NEEDS_S=([attention]=20 [train]=140 [kernels]=90 [steps]=${NEEDS_STEPS_S:-150} [generation]=${NEEDS_GENERATION_S:-150}
                    [generation-triton]=60 [grpo-automodel]=80 [grpo-megatron]=140)
for piece in $PIECES; do
    [ -n "${NEEDS_S[$piece]:-}" ] || { echo "unknown piece $piece (one of ${ORDER[*]})"; exit 2; }
done

PROF=/tmp/hpcrl-issue25-prof
mkdir -p "$OUT" "$PROF"
cd "$REPO" || exit 1
if [ "$SMOKE" != 1 ]; then
    if [ ! -d /tmp/site/ray ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$REPO"/.whl/*.whl || exit 1
    fi
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 HPCRL_CACHE=/tmp/hpcrl-cache
export NRL_MEGATRON_CHECKPOINT_DIR=/tmp/hpcrl-megatron-ckpt
rm -rf /tmp/grpo-automodel /tmp/grpo-megatron

"$PYTHON" - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "triton", "ray", "megatron-core", "megatron-bridge"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
PY
nvidia-smi -L >> "$OUT/versions.txt" 2>&1

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
# bounded SECONDS LOG CMD...: CMD in a session of its own, output in LOG and on stdout, stopped
# after SECONDS together with everything it started (Ray's processes).
bounded() {
    local limit=$1 log=$2
    shift 2
    if [ "$limit" -lt 15 ]; then
        echo "== skipped (budget spent): $*" | tee "$log"
        return 124
    fi
    echo "== $(date +%T) up to ${limit}s: $*" | tee "$log"
    local started=$SECONDS
    setsid "$@" >> "$log" 2>&1 &
    local pid=$!
    tail -n +2 -f "$log" --pid "$pid" &
    local tailer=$!
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - started)) -lt "$limit" ]; do
        sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "== stopped after ${limit}s" >> "$log"
        kill -TERM -- "-$pid" 2>/dev/null
        sleep 3
    fi
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid"
    local status=$?
    wait "$tailer" 2>/dev/null
    echo "== exit $status after $((SECONDS - started))s" | tee -a "$log"
    return "$status"
}

SMOKE_TINY=
SMOKE_STEPS=
DEFAULT_LAUNCH=grouped,16,1,3,512  # KernelLaunch().as_text(), in the engine's hpcrl row (< 128 rows)
if [ "$SMOKE" = 1 ]; then
    SMOKE_TINY=--tiny
    SMOKE_STEPS="--device cpu --tiny --batches 2,4 --rounds 1 --kinds default,per-head \
        --new-tokens 24 --prompt-min 4 --prompt-max 12"
    TRAIN_ARGS=(--device cpu --tiny --rounds 2 --steps 2 --warmup 1 --profile-steps 1)
    GEN_ARGS=(--tiny --no-self-checks)
    GRPO_A=(--tiny)
    GRPO_M=(--recipe grpo-tiny-1n-cpu-megatron.yaml --cluster local --steps 3)
else
    TRAIN_ARGS=(--device cuda --rounds 3 --steps 8 --profile-steps 2)
    GEN_ARGS=(--rounds 3 ${GEN_EXTRA:-})
    GRPO_A=(--steps "$GRPO_STEPS")
    GRPO_M=(--recipe grpo-llama-1b-1n1g-megatron.yaml --steps "$GRPO_STEPS")
fi

wanted attention && [ "$SMOKE" != 1 ] && bounded "$(at_most 60 attention)" "$OUT/attention.log" \
    "$PYTHON" benchmarks/attention_backends.py

PROFILE_ARGS=()
[ "$PROFILE" = 1 ] && PROFILE_ARGS=(--profile-dir "$PROF")
TRACE_ARGS=()  # TRACE_LOOPS=backend,...: those train loops' profiled steps as Chrome traces
[ "$PROFILE" = 1 ] && [ -n "${TRACE_LOOPS:-}" ] && TRACE_ARGS=(--trace-loops "$TRACE_LOOPS")
# TRACE_PYTHON=1: those traces also hold the Python calls (names host time between operators)
[ "${#TRACE_ARGS[@]}" -gt 0 ] && [ "${TRACE_PYTHON:-0}" = 1 ] && TRACE_ARGS+=(--trace-python)
wanted train && bounded "$(at_most 240 train)" "$OUT/train.log" "$PYTHON" \
    benchmarks/train_throughput.py --skip-megatron --loops "$TRAIN_LOOPS" \
    "${PROFILE_ARGS[@]}" "${TRACE_ARGS[@]}" "${TRAIN_ARGS[@]}"

wanted kernels && [ "$SMOKE" != 1 ] && bounded "$(at_most 180 kernels)" "$OUT/kernels.log" \
    "$PYTHON" benchmarks/decode_attention_kernels.py --kinds "$KERNEL_KINDS" --shapes llama-1b

wanted steps && bounded "$(at_most 300 steps)" "$OUT/steps.log" \
    env TRITON_INTERPRET="$SMOKE" "$PYTHON" benchmarks/decode_step_launches.py ${SMOKE_STEPS:-} \
    --budget-s "$(( $(at_most 300 steps) - 60 ))"

# The engine also runs the launches these pieces found fastest: the steps piece's (over both
# batches, then per batch; not the shipped default), else the kernels piece's tensor-core one
launches=$(sed -n 's/^BEST-STEP-LAUNCH [^:]*: \([^ ]*\) .*/\1/p' "$OUT/steps.log" 2>/dev/null \
    | tac | grep -vx "$DEFAULT_LAUNCH" | awk '!seen[$0]++' | head -3)
[ -z "$launches" ] && launches=$(sed -n \
    's/^BEST-LAUNCH llama-1b all-batches dot: \([^ ]*\) .*/\1/p' "$OUT/kernels.log" \
    2>/dev/null | tail -1)
launches="$launches ${EXTRA_LAUNCHES:-}"  # e.g. a baseline launch (KernelLaunch.parse's text)
LAUNCH_ARGS=()
index=0
for launch in $launches; do
    index=$((index + 1))
    row=hpcrl-launch$([ "$index" -gt 1 ] && echo "$index")
    [[ ",$GEN_ROWS," != *",$row,"* ]] && GEN_ROWS="$GEN_ROWS,$row"
done
[ -n "${launches// /}" ] && LAUNCH_ARGS=(--launch "$(echo $launches | tr ' ' '+')")
wanted generation && bounded "$(at_most 260 generation)" "$OUT/generation.log" "$PYTHON" \
    benchmarks/generation_throughput.py --rows "$GEN_ROWS" "${PROFILE_ARGS[@]}" \
    "${LAUNCH_ARGS[@]}" --json-out "$PROF/generation.json" "${GEN_ARGS[@]}"

wanted generation-triton && bounded "$(at_most 150 generation-triton)" \
    "$OUT/generation-triton.log" "$PYTHON" benchmarks/generation_throughput.py \
    --rows hpcrl,hpcrl-triton --no-self-checks --rounds 3 ${SMOKE_TINY:-}

pass_profiles() { [ "$PROFILE" = 1 ] && echo "$PROF/$1"; }
wanted grpo-automodel && HPCRL_PROFILE_PASSES=$(pass_profiles grpo-automodel) bounded \
    "$(at_most 150 grpo-automodel)" "$OUT/grpo-automodel.log" "$PYTHON" benchmarks/grpo_step.py \
    --label automodel --out-dir /tmp/grpo-automodel "${GRPO_A[@]}"
cp /tmp/grpo-automodel/metrics.jsonl "$PROF/grpo-automodel.metrics.jsonl" 2>/dev/null

wanted grpo-megatron && HPCRL_PROFILE_PASSES=$(pass_profiles grpo-megatron) bounded \
    "$(at_most 300 grpo-megatron)" "$OUT/grpo-megatron.log" "$PYTHON" benchmarks/grpo_step.py \
    --label megatron --out-dir /tmp/grpo-megatron "${GRPO_M[@]}"
cp /tmp/grpo-megatron/metrics.jsonl "$PROF/grpo-megatron.metrics.jsonl" 2>/dev/null

# Megatron's steady step against Automodel's (item 2's goal: <= 1.5x), from the two summaries
"$PYTHON" - <<'PY' 2>&1 | tee "$OUT/backends.txt"
import json, pathlib
runs = {name: pathlib.Path(f"/tmp/grpo-{name}/grpo_step_summary.json")
        for name in ("automodel", "megatron")}
found = {n: json.loads(p.read_text()) for n, p in runs.items() if p.exists()}
for name, summary in found.items():
    parts = summary["breakdown"]
    print(f"{name}: median step {summary['median_step_s_from_step_3']:.3f} s = generate "
          f"{parts.get('time_generate_s', 0):.3f} (refit {parts.get('time_refit_s', 0):.3f}) + "
          f"log-probs {parts.get('time_logprobs_s', 0):.3f} + train {parts.get('time_train_s', 0):.3f}")
if len(found) == 2:
    ratio = (found["megatron"]["median_step_s_from_step_3"]
             / found["automodel"]["median_step_s_from_step_3"])
    print(f"GOAL Megatron / Automodel GRPO step <= 1.5x: {ratio:.2f}x "
          f"{'MET' if ratio <= 1.5 else 'NOT MET'}")
PY

{
    for log in "$OUT"/*.log; do
        echo "== $(basename "$log")"
        grep -E "GOAL|BOUND|BEST|SYNC|self-check|summary |/ best plain|variant |TB/s|^steps |^backend|^plain|^default|^flash|^cudnn|^efficient|^ *(64|256) |where a steady step goes|median step|== exit|Error" "$log"
    done
    cat "$OUT/backends.txt"
} > "$OUT/summary.txt" 2>/dev/null
tar czf "$OUT/profiles.tgz" -C "$(dirname "$PROF")" "$(basename "$PROF")" 2>/dev/null
ls -la "$OUT"
