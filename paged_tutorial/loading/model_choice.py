"""Which model a notebook should run here, and loading it.

    choice = choose_model()          # what, in which dtype, on which device, and why
    model, choice = load_chosen_model(choice)

The rule, first match wins:

1. ``PAGED_TUTORIAL_MODEL`` names any source ``load_model`` accepts (an alias, a ``.gguf``
   file, a model folder, a hub id such as ``unsloth/Llama-3.2-1B-Instruct``).  It is loaded or
   the error is raised: an explicit choice never falls back silently.  (The test suite sets it
   to ``smollm2-135m`` so that stored notebook outputs are reproducible.)
2. ``LLAMA_3_2_1B_DIR`` names a local Llama-3.2-1B-Instruct folder.
3. A CUDA GPU is visible: Llama-3.2-1B-Instruct from its ungated hub copy (no login needed).
   If it cannot be downloaded (offline, hub down) the embedded SmolLM2 is used instead and the
   choice's ``reason`` says why.
4. Otherwise the embedded SmolLM2-135M-Instruct, on the CPU.

dtype: ``dtype_choice.choose_dtype`` (float32 on the CPU and for SmolLM2 anywhere; on a GPU
bfloat16 for the other models, float16 on a GPU without native bfloat16 such as Colab's T4).
Weights are loaded straight
onto the device (``load_model(..., device=...)``), one tensor at a time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from paged_tutorial.loading.catalog import LLAMA_3_2_1B_UNGATED, known_model
from paged_tutorial.loading.dtype_choice import choose_dtype, gpu_dtype

MODEL_ENV = "PAGED_TUTORIAL_MODEL"
LOCAL_LLAMA_ENV = "LLAMA_3_2_1B_DIR"
FALLBACK_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelChoice:
    source: str          # what load_model is given
    dtype: str
    device: str
    reason: str          # one line: why this model
    may_fall_back: bool  # True when a failure to download means "use SmolLM2 instead"

    @property
    def name(self) -> str:
        """A readable name: the catalog alias when the model is in the catalog."""
        entry = known_model(self.source)
        return entry.alias if entry is not None else self.source


def _placement(source: str, gpu: bool) -> tuple[str, str]:
    device = "cuda" if gpu else "cpu"
    return choose_dtype(source, device, half=gpu_dtype() if gpu else None).dtype, device


def choose_model(environ=None, gpu: bool | None = None) -> ModelChoice:
    """Apply the module's rule; ``environ`` (default os.environ) and ``gpu`` (default: torch
    sees a CUDA GPU) are parameters so that the rule can be tested."""
    environ = os.environ if environ is None else environ
    gpu = torch.cuda.is_available() if gpu is None else gpu
    for variable in (MODEL_ENV, LOCAL_LLAMA_ENV):
        source = environ.get(variable, "").strip()
        if source:
            dtype, device = _placement(source, gpu)
            return ModelChoice(source, dtype, device, f"{variable}={source}", False)
    if gpu:
        dtype, device = _placement(LLAMA_3_2_1B_UNGATED, gpu)
        return ModelChoice(LLAMA_3_2_1B_UNGATED, dtype, device,
                           "a CUDA GPU is visible: Llama-3.2-1B-Instruct (ungated hub copy)", True)
    return ModelChoice(FALLBACK_MODEL, "float32", "cpu",
                       "no CUDA GPU: the embedded SmolLM2-135M-Instruct", False)


def load_chosen_model(choice: ModelChoice | None = None, progress: bool = False):
    """``(model, choice)``.  The returned choice is the one that loaded: for a GPU default that
    could not be downloaded, SmolLM2, with the download error in its ``reason``."""
    from paged_tutorial.loading.models import load_model

    choice = choice or choose_model()
    try:
        model = load_model(choice.source, choice.dtype, device=choice.device, progress=progress)
    except (ConnectionError, PermissionError, FileNotFoundError) as exc:
        if not choice.may_fall_back:
            raise
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        dtype, device = _placement(FALLBACK_MODEL, choice.device == "cuda")
        choice = replace(choice, source=FALLBACK_MODEL, dtype=dtype, device=device,
                         reason=f"{choice.source} could not be loaded ({first_line[:160]})",
                         may_fall_back=False)
        model = load_model(choice.source, choice.dtype, device=choice.device, progress=progress)
    return model, choice
