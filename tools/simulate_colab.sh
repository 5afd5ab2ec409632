#!/usr/bin/env bash
# A Colab runtime, as closely as a GPU machine with no network can play one: Python 3.12 with
# torch preinstalled (a venv over the system site-packages), the notebooks' first cell run as
# Colab runs it (google.colab imported), installing offline from this checkout and the wheels
# that tools/colab_sim_wheels.sh put in .colab-sim/wheels.  Then: a chapter notebook's code on
# the GPU, backend="auto" on the GPU, and auto's fallback when numba cannot launch.
#
#   here:     bash tools/colab_sim_wheels.sh            # once, needs the package index
#   GPU:      bash tools/simulate_colab.sh              # writes $OUT/colab-sim.log
#             (the device tool: carry [".colab-sim"])
#
# What differs from Colab: the driver (this machine's, CUDA 13: the cu12 path cannot be run
# here, only chosen), no download (so numba-cuda's toolkit extra is replaced by the image's CUDA
# toolkit, PAGED_TUTORIAL_CUDA_EXTRA=none, and the 98 MB SmolLM2 package is not installed),
# and the notebook code runs as a script, not in a Jupyter kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/colab-sim-out}
mkdir -p "$OUT"
LOG="$OUT/colab-sim.log"
exec > >(tee "$LOG") 2>&1
REPO=$(pwd)
SCRATCH=${TMPDIR:-/tmp}
VENV=$SCRATCH/colab-venv           # the simulated runtime's Python
FAKE_COLAB=$SCRATCH/fake-colab     # an importable google.colab, as Colab has
WHEELS="$REPO/.colab-sim/wheels"
status=0
step() { echo; echo "=== $*"; }

step "runtime"
python3 --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
nvidia-smi | grep -o "CUDA Version: [0-9.]*" || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
ls "$WHEELS" | wc -l | sed 's/$/ carried wheels/'

step "a Colab-like venv: Python 3.12 + the preinstalled torch (the image's packages visible)"
# python3 there may itself be a venv, whose packages --system-site-packages would not show: a
# .pth file adds its site-packages after the new venv's own, so pip installs what must change
# into the new venv and leaves the image alone
python3 -m venv "$VENV"
PY=$VENV/bin/python
python3 -c "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])" \
    | sort -u > "$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/preinstalled.pth"
"$PY" -c "import torch; print('torch visible in the venv:', torch.__version__)"
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS" PIP_DISABLE_PIP_VERSION_CHECK=1
export PAGED_TUTORIAL_CUDA_EXTRA=none
mkdir -p "$FAKE_COLAB/google/colab"
: > "$FAKE_COLAB/google/colab/__init__.py"

# run_cell SOURCE: the notebooks' first cell, as Colab would run it, with INSTALL_SOURCE=SOURCE
run_cell() {
    PYTHONPATH="$FAKE_COLAB" "$PY" - "$1" <<'PYCELL'
import sys
sys.path.insert(0, "tools")
import google.colab                                 # imported at start-up on Colab
import colab_cell
source = colab_cell.cell_source(sys.argv[1])
assert source.count(sys.argv[1]) == 1
exec(compile(source, "<colab cell>", "exec"), {"__name__": "__main__"})
PYCELL
}

step "first cell, unreachable INSTALL_SOURCE (must stop with a clear message)"
if run_cell "https://github.com/paged-tutorial/no-such-repository.git"; then
    echo "UNEXPECTED: the cell did not stop"; status=1
else
    echo "(stopped, as it should)"
fi

step "first cell, INSTALL_SOURCE = this checkout (offline pip from carried wheels)"
run_cell "$REPO" || { echo "FAILED: install cell"; status=1; }

step "first cell again (after a restart it must be quick and ask for no restart)"
time run_cell "$REPO" || { echo "FAILED: second run"; status=1; }

step "which CUDA extra Colab would pick on this driver"
"$PY" -c "
import sys; sys.path.insert(0, 'tools'); import os, colab_setup
os.environ.pop('PAGED_TUTORIAL_CUDA_EXTRA', None)
v = colab_setup.driver_cuda_version(); print(v, colab_setup.cuda_extra(v))"

step "backend='auto' on the GPU"
"$PY" -W error::RuntimeWarning -c "
import paged_tutorial as pt, torch
from paged_tutorial.backends import make_backend
b = make_backend('auto'); print(b.describe())
assert b.name == 'numba', b.name" || { echo "FAILED: auto did not pick numba"; status=1; }

step "backend='auto' when numba cannot launch (kernels built for a GPU this is not)"
NUMBA_FORCE_CUDA_CC=10.0 "$PY" -c "
import warnings, paged_tutorial as pt
from paged_tutorial.backends import make_backend
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    b = make_backend('auto')
print('backend:', b.describe())
print('warnings:', [str(x.message) for x in w])
assert b.name == 'torch' and len(w) == 1" || echo "(NUMBA_FORCE_CUDA_CC did not make numba fail here: see above)"

step "the command line refuses numba before loading weights when it cannot launch"
NUMBA_FORCE_CUDA_CC=10.0 "$PY" -m paged_tutorial "hi" --backend numba; echo "exit status $?"

step "notebook 04's code on the GPU (backend numba), as a script"
"$PY" - notebooks/04_warp_shuffle_reduction.ipynb <<'PYNB' || { echo "FAILED: notebook 04"; status=1; }
import json, sys, io, contextlib, traceback, os
import matplotlib
matplotlib.use("Agg")
path = sys.argv[1]
os.chdir(os.path.dirname(path))
cells = [c for c in json.load(open(os.path.basename(path)))["cells"] if c["cell_type"] == "code"]
namespace = {"__name__": "__main__", "display": print}
failed = 0
for i, cell in enumerate(cells):
    source = "".join(cell["source"])
    if source.lstrip().startswith(("%", "!")):
        continue
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(source, f"<cell {i}>", "exec"), namespace)
        stored = "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                         if o.get("output_type") == "stream" and o.get("name") == "stdout")
        same = "same" if buffer.getvalue() == stored else "DIFFERENT"
        print(f"cell {i}: ok, stdout {same} as stored")
        if same == "DIFFERENT":
            print("  got:   ", buffer.getvalue()[:400].replace("\n", " | "))
            print("  stored:", stored[:400].replace("\n", " | "))
    except Exception:
        failed += 1
        print(f"cell {i}: FAILED\n{traceback.format_exc()[-1500:]}")
print(f"{len(cells)} code cells, {failed} failed")
sys.exit(1 if failed else 0)
PYNB

step "notebook 08's result files from outside the repository"
(cd /tmp && "$PY" -c "
from paged_tutorial.teaching import results
print(results.find('decode'), results.load('attention-2026-11-30')['gpu'])") || { echo "FAILED: results"; status=1; }

step "pip list of the simulated runtime (what the cell changed)"
"$PY" -m pip list --path "$VENV/lib/python3.12/site-packages" 2>/dev/null
echo
echo "simulation status: $status"
exit $status
