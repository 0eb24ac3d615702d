#!/usr/bin/env bash
# The GPU end-to-end check (tests/gpu) on the H200 test machine, in one device call:
#
#   here:    python3 tests/gpu/make_wheelhouse.py        (fills the git-ignored .whl/)
#   device:  command "bash tests/gpu/device_run.sh", carry [".whl"], timeout_s 600
#            (extra arguments go to pytest, e.g. "bash tests/gpu/device_run.sh -k automodel")
#
# Installs the wheels into /tmp/site (the device README's command), runs pytest tests/gpu with
# HPCRL_REQUIRE_GPU=1 from outside the checkout's root (there the checkout's hpcrl would shadow
# the installed one), bounded so that the results are always packed, and leaves in $OUT:
# pytest.log, report.txt (hpcrl report of the offload sweep), the sweep's PNG plots and
# gpu-runs.tgz (every run folder: metrics, logs, job records). At most 8 files come back.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/hpcrl-gpu-out}
RUNS=/tmp/hpcrl-gpu-runs
PYTEST_LIMIT_S=${PYTEST_LIMIT_S:-530}  # + install and packing: inside 600 s
mkdir -p "$OUT" "$RUNS"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$REPO"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site HPCRL_REQUIRE_GPU=1 HPCRL_GPU_TEST_OUT="$RUNS" PYTHONUNBUFFERED=1

cd /tmp || exit 1
nvidia-smi -L
python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import importlib.metadata as md, sys
import hpcrl
print("python", sys.version.split()[0], "| hpcrl from", hpcrl.__file__)
for name in ("torch", "transformers", "ray", "megatron-core", "megatron-bridge", "submitit"):
    print(name, md.version(name))
PY

# -s: hpcrl's own output streams into the log as it happens (kept even if the bound hits)
timeout -k 10 "$PYTEST_LIMIT_S" python3 -m pytest -p no:cacheprovider -s -v -rfEs --timeout=900 \
    "$REPO/tests/gpu" "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}

SWEEP="$RUNS/offload-sweep"
if [ -f "$SWEEP/sweep.json" ]; then
    python3 -m hpcrl.cli.main report "$SWEEP" 2>&1 | tee "$OUT/report.txt"
    cp "$SWEEP"/report/*.png "$OUT"/ 2>/dev/null
    for point in "$SWEEP"/point-*; do
        echo "== $point"; cat "$point/metrics.jsonl" 2>/dev/null
    done >> "$OUT/report.txt"
fi
for run in automodel megatron; do
    [ -f "$RUNS/$run/metrics.jsonl" ] && python3 -m hpcrl.cli.main report "$RUNS/$run"
done 2>&1 | tee -a "$OUT/report.txt"
tar czf "$OUT/gpu-runs.tgz" -C "$(dirname "$RUNS")" "$(basename "$RUNS")"
ls -la "$OUT"
exit "$status"
