#!/usr/bin/env bash
# Every GPU result of the project, in two parts that each fit one device call:
#
#     bash benchmarks/gpu_all.sh core       # tests + decode + attention + profile (<= 9 min),
#                                           # carrying .whl
#     bash benchmarks/gpu_all.sh chapters   # racecheck (limit 3), table copies (limit 4),
#                                           # prefix sharing (chapter 09), <= 5 min; numpy from
#                                           # .whl or .colab-sim/wheels
#
# core:
# 1. the README's test command on the GPU (tests/ + the notebooks that need no model file),
#    summarised by benchmarks/gpu_tests.py as gpu-tests-<date>.json;
# 2. benchmarks/decode.py    -> decode-<date>.json    (correctness vs HF first, then speed);
# 3. benchmarks/attention.py -> attention-<date>.json;
# 4. benchmarks/kernels.py   -> kernels-<date>.json   (small kernels, GEMV vs cuBLAS);
# 5. benchmarks/profile_step.py -> profile-<date>.json (per-kernel profile of decode/prefill).
#
# chapters: benchmarks/racecheck.py -> racecheck-<date>.json, benchmarks/table_copy.py ->
# table-copy-<date>.json, benchmarks/prefix_sharing.py --gpu -> prefix-sharing-gpu-<date>.json.
#
# Everything goes to $OUT (the device tool's result folder) or, without it, benchmarks/results;
# gpu_all.log keeps the whole output.  Each step has its own time limit, so one slow step
# cannot take the others' results with it.  Wheels in .whl (../shared/device/README.md:
# numpy 2.3.5 for numba-cuda, nbval + ipykernel for the notebooks) are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PART=${1:-core}
SITE=${TMPDIR:-/tmp}/site        # the carried wheels are installed here, beside the image's
if [ ! -e "$SITE/.gpu_all_installed" ]; then
    if [ -d .whl ]; then
        wheels=(.whl/*.whl)
    else                         # the chapters part needs numpy < 2.5 only (numba-cuda 0.30)
        wheels=(.colab-sim/wheels/numpy-*.whl)
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" && touch "$SITE/.gpu_all_installed" || exit 1
fi
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
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

# limits: about 1.5x what each took on an H200 on 2026-11-30 (tests 125 s before the round-2
# notebooks and puzzles, decode.py with HF static ~130 s, attention.py ~45 s, profile ~25 s).
# benchmarks/kernels.py (small kernels vs copy bandwidth, GEMV vs cuBLAS) is run by hand.
case "$PART" in
core)
    step tests 230 python3 benchmarks/gpu_tests.py --out "$OUT" --timeout 220
    step decode 170 python3 benchmarks/decode.py --out "$OUT"
    step attention 65 python3 benchmarks/attention.py --out "$OUT"
    step profile 45 python3 benchmarks/profile_step.py --out "$OUT"
    ;;
chapters)
    step racecheck 120 python3 benchmarks/racecheck.py --out "$OUT"
    step table_copy 120 python3 benchmarks/table_copy.py --out "$OUT"
    step prefix_sharing 90 python3 benchmarks/prefix_sharing.py --gpu --out "$OUT"
    ;;
*)
    echo "usage: bash benchmarks/gpu_all.sh core|chapters" >&2
    exit 2
    ;;
esac
echo "=== gpu_all.sh $PART done after $SECONDS s" | tee -a "$LOG"
