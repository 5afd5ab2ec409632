#!/usr/bin/env bash
# Does the README's install command resolve on every OS it promises?  CI runs this (it needs the
# package index, not a GPU).  For each platform, uv resolves pyproject.toml as that machine's pip
# would, evaluating the environment markers (sys_platform, ...) for *that* platform;
# `pip install --dry-run --platform ...` cannot do this, because pip evaluates markers against
# the machine it runs on.
#
#   bash tools/check_platforms.sh            # uv from PATH, else installed into a scratch venv
#   UV=/path/to/uv bash tools/check_platforms.sh
#
# What each platform must get (README, "What runs where"):
#   macOS 14+ on Apple silicon  numba-cuda 0.20.1 (pure Python; simulator only), no cuda-bindings
#   Windows x86-64, Linux       numba-cuda 0.30.x (GPU kernels + simulator)
#   Linux with the gpu extra    triton
#   every platform (serve)      llguidance 1.x (response_format), no xgrammar
#   Colab (Linux, CUDA 12/13)   the notebooks' install: .[hf] plus numba-cuda's cu12 / cu13 extra
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${PYTHON_VERSION:-3.12}
UV=${UV:-}
if [ -z "$UV" ]; then
    if command -v uv >/dev/null 2>&1; then
        UV=uv
    else
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        python3 -m venv "$scratch/venv"
        "$scratch/venv/bin/python" -m pip install -q "uv>=0.5,<1"
        UV="$scratch/venv/bin/uv"
    fi
fi
echo "$($UV --version); Python $PYTHON_VERSION"

out=$(mktemp -d)
failures=0

# resolve NAME PLATFORM EXTRAS...: writes $out/NAME.txt, or counts a failure
resolve() {
    local name=$1 platform=$2
    shift 2
    local extras=()
    for e in "$@"; do extras+=(--extra "$e"); done
    # torch 2.12+ ships macOS wheels for macOS 14 and later only
    if MACOSX_DEPLOYMENT_TARGET=14.0 "$UV" pip compile pyproject.toml "${extras[@]}" \
            --python-version "$PYTHON_VERSION" --python-platform "$platform" \
            --quiet --no-header --no-annotate -o "$out/$name.txt" 2>"$out/$name.err"; then
        return 0
    fi
    echo "FAIL $name: does not resolve for $platform (extras: $*)"
    sed 's/^/    /' "$out/$name.err"
    failures=$((failures + 1))
    return 1
}

# pinned NAME PACKAGE: the version NAME.txt pins PACKAGE to ('' when absent)
pinned() {
    sed -n "s/^$2==\([^ ;]*\).*/\1/p" "$out/$1.txt"
}

# expect NAME PACKAGE PATTERN: PACKAGE's pinned version must match the extended regex PATTERN
# ('^$' = must be absent)
expect() {
    local got
    got=$(pinned "$1" "$2")
    if [[ "$got" =~ $3 ]]; then
        echo "  ok   $1: $2 ${got:-absent}"
    else
        echo "FAIL $1: $2 ${got:-absent}, expected /$3/"
        failures=$((failures + 1))
    fi
}

if resolve macos-dev aarch64-apple-darwin dev; then
    expect macos-dev numba-cuda '^0\.20\.1$'
    expect macos-dev cuda-bindings '^$'
    expect macos-dev torch '^2\.'
    expect macos-dev llguidance '^1\.'
    expect macos-dev xgrammar '^$'
    expect macos-dev triton '^$'
fi
if resolve windows-dev x86_64-pc-windows-msvc dev; then
    expect windows-dev numba-cuda '^0\.30\.'
    expect windows-dev torch '^2\.'
    expect windows-dev llguidance '^1\.'
    expect windows-dev xgrammar '^$'
    expect windows-dev triton '^$'
fi
if resolve linux-dev x86_64-manylinux_2_28 dev; then
    expect linux-dev numba-cuda '^0\.30\.'
    expect linux-dev torch '^2\.'
    expect linux-dev llguidance '^1\.'
    expect linux-dev xgrammar '^$'
fi
if resolve linux-arm-dev aarch64-manylinux_2_28 dev; then
    expect linux-arm-dev numba-cuda '^0\.30\.'
    expect linux-arm-dev torch '^2\.'
    expect linux-arm-dev llguidance '^1\.'
    expect linux-arm-dev xgrammar '^$'
fi
if resolve linux-gpu x86_64-manylinux_2_28 dev gpu; then
    expect linux-gpu triton '^3\.'
fi
if resolve windows-gpu x86_64-pc-windows-msvc dev gpu; then
    expect windows-gpu triton '^$'
fi
if resolve macos-gpu aarch64-apple-darwin dev gpu; then
    expect macos-gpu triton '^$'
fi
# the Colab cell (tools/colab_cell.py): no test tools, the toolkit matching the driver
if resolve colab-cu12 x86_64-manylinux_2_28 hf cu12; then
    expect colab-cu12 cuda-bindings '^12\.'
    expect colab-cu12 numba-cuda '^0\.30\.'
    expect colab-cu12 pytest '^$'
    expect colab-cu12 jupyterlab '^$'
fi
if resolve colab-cu13 x86_64-manylinux_2_28 hf cu13; then
    expect colab-cu13 cuda-bindings '^13\.'
    expect colab-cu13 pytest '^$'
fi
if resolve windows-cu12 x86_64-pc-windows-msvc dev cu12; then
    expect windows-cu12 cuda-bindings '^12\.'
fi

rm -rf "$out"
if [ "$failures" -ne 0 ]; then
    echo "$failures platform check(s) failed"
    exit 1
fi
echo "all platform checks passed"
