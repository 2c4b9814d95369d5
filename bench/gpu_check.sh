#!/usr/bin/env bash
# The prepared GPU check (issue 12): on a machine with a CUDA GPU, in under 5 minutes,
#   1. the CUDA-parametrised engine tests (tests/guard/engine: every test over cpu and cuda,
#      fp16 overflow-skip included), the cuda cases only;
#   2. the framework loops on cuda (tests/guard/frameworks: HF Trainer fp32/bf16, Lightning
#      bf16-mixed manual optimisation, parametrised over the devices present) and the host-read
#      budget test;
#   3. bench/host_syncs.py on cuda (host reads per optimizer step, guard off / on, and CUDA's
#      own count of synchronizing calls from torch.cuda.set_sync_debug_mode);
#   4. short runs of the overhead benches (bench/guard_overhead.py, bench/engine_overhead.py).
# Then a short summary, one line per stage. Never part of CI: pytest does not collect .sh files,
# and the script refuses to run where CI is set or no CUDA device is visible.
#
#     bash bench/gpu_check.sh            # from the repository root, its virtualenv active
#
# Each stage has its own time limit (STAGE_LIMIT seconds, default 75), cut further so that the
# whole run ends within TOTAL_LIMIT seconds (default 290: under 5 minutes); a stage that hits
# its limit is reported as "timeout", and one with no time left as "skipped".
set -u
cd "$(dirname "$0")/.."

if [ -n "${CI:-}" ]; then
    echo "gpu_check: CI is set; this check runs on GPU machines only" >&2
    exit 0
fi
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible; nothing run" >&2
    exit 0
fi

LIMIT="${STAGE_LIMIT:-75}"
TOTAL="${TOTAL_LIMIT:-290}"
LOGS="$(mktemp -d)"
SUMMARY=()
FAILED=0

stage() {  # stage NAME COMMAND...: run with a time limit, keep its log, record one summary line
    local name="$1"
    shift
    local start=$SECONDS
    local left=$((TOTAL - SECONDS))
    local limit=$((left < LIMIT ? left : LIMIT))
    if [ "$limit" -le 0 ]; then
        FAILED=1
        SUMMARY+=("$(printf '%-16s %-16s' "$name" "skipped (no time left)")")
        return
    fi
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    local verdict="ok"
    if [ "$rc" -eq 124 ]; then verdict="timeout"; elif [ "$rc" -ne 0 ]; then verdict="FAILED (rc $rc)"; fi
    [ "$verdict" = "ok" ] || FAILED=1
    SUMMARY+=("$(printf '%-16s %-16s %4ss  %s' "$name" "$verdict" "$took" "$(tail -n 1 "$LOGS/$name.log")")")
}

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
python -c "import torch; print('gpu_check on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

stage engine-cuda python -m pytest -q -p no:cacheprovider tests/guard/engine -k cuda
stage frameworks-cuda python -m pytest -q -p no:cacheprovider tests/guard/frameworks -k cuda
stage host-budget python -m pytest -q -p no:cacheprovider tests/guard/test_host_read_budget.py
stage host-syncs python bench/host_syncs.py --device cuda
stage guard-overhead python bench/guard_overhead.py --rounds 30 --engine-workers 2
stage engine-overhead python bench/engine_overhead.py --rounds 200

echo
echo "gpu_check summary (logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}"
echo
echo "--- host reads (bench/host_syncs.py --device cuda)"
cat "$LOGS/host-syncs.log" 2>/dev/null || echo "(not run)"
exit "$FAILED"
