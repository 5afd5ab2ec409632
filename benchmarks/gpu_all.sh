#!/usr/bin/env bash
# Every GPU result of the project in one device call (about 6 minutes on an H200, at most 9):
#
#     bash benchmarks/gpu_all.sh            # from the repository root, carrying .whl
#
# 1. the README's test command on the GPU (tests/ + the notebooks that need no model file),
#    summarised by benchmarks/gpu_tests.py as gpu-tests-<date>.json;
# 2. benchmarks/decode.py    -> decode-<date>.json    (correctness vs HF first, then speed);
# 3. benchmarks/attention.py -> attention-<date>.json;
# 4. benchmarks/kernels.py   -> kernels-<date>.json   (small kernels, GEMV vs cuBLAS);
# 5. benchmarks/profile_step.py -> profile-<date>.json (per-kernel profile of decode/prefill).
#
# Everything goes to $OUT (the device tool's result folder) or, without it, benchmarks/results;
# gpu_all.log keeps the whole output.  Each step has its own time limit, so one slow step
# cannot take the others' results with it.  Wheels in .whl (../shared/device/README.md:
# numpy 2.3.5 for numba-cuda, nbval + ipykernel for the notebooks) are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
if [ -d .whl ] && [ ! -e /tmp/site/.gpu_all_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && touch /tmp/site/.gpu_all_installed || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
LOG=$OUT/gpu_all.log
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee -a "$LOG"

step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit} s)" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$LOG"
}

# limits: about 1.5x what each took on an H200 on 2026-11-30 (tests 125 s, decode.py with
# HF static ~130 s, attention.py ~45 s, kernels.py ~40 s, profile_step.py ~25 s)
step tests 185 python3 benchmarks/gpu_tests.py --out "$OUT" --timeout 175
step decode 170 python3 benchmarks/decode.py --out "$OUT"
step attention 65 python3 benchmarks/attention.py --out "$OUT"
step kernels 55 python3 benchmarks/kernels.py --out "$OUT"
step profile 45 python3 benchmarks/profile_step.py --out "$OUT"
echo "=== gpu_all.sh done after $SECONDS s" | tee -a "$LOG"
