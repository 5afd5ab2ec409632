"""Which dtype a model loads in when the caller names none, and why.

    choice = choose_dtype("smollm2-135m", "cuda")
    choice.dtype, choice.line()     # 'float32', 'float32: SmolLM2-135M is small enough ...'

The rule, first match wins:

1. a dtype the caller asked for (``dtype=`` / ``--dtype``) is used as it is;
2. on the CPU (or any device that is not a CUDA GPU), float32: the engine's tokens then match
   transformers' float32 ones, and half precision is not faster there on most CPUs;
3. on a GPU, what the model's catalog entry says (``catalog.KnownModel.gpu_dtype``): float32
   for the small SmolLM2-135M, the GPU's half type for Llama-3.2-1B and larger;
4. a model outside the catalog on a GPU: the GPU's half type (bfloat16 on Ampere and newer,
   float16 on older GPUs such as Colab's T4).
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_tutorial.config import check_dtype
from paged_tutorial.loading.catalog import HALF, known_model


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str       # "float32", "bfloat16" or "float16"
    reason: str      # why, in one clause

    def line(self) -> str:
        """``"<dtype>: <reason>"``, the line the command line and ``load_model`` show."""
        return f"{self.dtype}: {self.reason}"


def gpu_dtype() -> str:
    """bfloat16 where the GPU computes in it natively (Ampere and newer), else float16 (a T4)."""
    import torch

    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:                                   # torch without that argument
        native = torch.cuda.is_bf16_supported()
    return "bfloat16" if native else "float16"


def _device_type(device) -> str:
    if device is None:
        return "cpu"
    return getattr(device, "type", None) or str(device).split(":")[0]


def choose_dtype(source, device=None, requested: str | None = None,
                 half: str | None = None) -> DtypeChoice:
    """The module's rule for ``source`` (an alias, hub id, file or folder) on ``device``
    (default: the CPU).  ``half`` is the GPU's half type (default: ``gpu_dtype()``, asked only
    when needed); a parameter so that the rule can be tested without a GPU."""
    if requested is not None:
        return DtypeChoice(check_dtype(requested), "asked for")
    device_type = _device_type(device)
    if device_type != "cuda":
        return DtypeChoice("float32", f"the {device_type.upper()}'s default (the tokens of "
                                      "transformers in float32; half precision is not faster "
                                      "there on most CPUs)")
    entry = known_model(source)
    if entry is None:
        half = half or gpu_dtype()
        return DtypeChoice(half, f"{source} is not in the catalog: {half}, the GPU's half "
                                 "type (pass dtype='float32' / --dtype float32 if its greedy "
                                 "answers differ from float32's)")
    if entry.gpu_dtype == HALF:
        half = half or gpu_dtype()
        return DtypeChoice(half, f"{entry.dtype_reason} ({half} is this GPU's half type)")
    return DtypeChoice(entry.gpu_dtype, entry.dtype_reason)
