#!/usr/bin/env bash
# One device call for issue 25's items 4 and 3: the decode attention's launches timed in the
# engine's whole decode step and the engine with the fastest ones (benchmarks/gpu_issue25.sh,
# pieces $DECODE_PIECES, default "steps generation"; "kernels generation" times the kernels
# alone instead), then the warm first step (benchmarks/gpu_issue25_items356.sh, piece
# first-step). Each part is bounded; what a part leaves under $OUT comes back even if a later
# one runs out of time.
#
#   device:  OUT=$OUT DECODE_S=470 FIRST_STEP_S=0 bash benchmarks/gpu_session_calls.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/hpcrl-session-out}
mkdir -p "$OUT/decode" "$OUT/first-step"
if [ "${DECODE_S:-330}" -gt 0 ]; then
    OUT="$OUT/decode" PIECES="${DECODE_PIECES:-steps generation}" PROFILE="${PROFILE:-1}" GEN_ROWS="${GEN_ROWS:-hpcrl}" \
        GEN_EXTRA="${GEN_EXTRA:---no-self-checks}" BUDGET_S="${DECODE_S:-330}" \
        NEEDS_GENERATION_S="${NEEDS_GENERATION_S:-200}" \
        bash "$REPO/benchmarks/gpu_issue25.sh" > "$OUT/decode.log" 2>&1
fi
if [ "${FIRST_STEP_S:-230}" -gt 0 ]; then
    OUT="$OUT/first-step" PIECES="${ITEMS356_PIECES:-first-step}" BUDGET_S="${FIRST_STEP_S:-230}" \
        bash "$REPO/benchmarks/gpu_issue25_items356.sh" > "$OUT/first-step.log" 2>&1
fi
for summary in "$OUT"/decode/summary.txt "$OUT"/first-step/summary.txt; do
    echo "===== $summary"
    grep -E "GOAL|BEST|BOUND|REFUSED|first / steady|kept compilations|== exit|Error" "$summary" 2>/dev/null | head -60
done
