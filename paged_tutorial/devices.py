"""Which devices a model can be loaded onto and an Engine can run on, checked before anything
is built there (``load_model(device=...)`` and ``Engine(device=...)`` both ask here).

The engine needs real memory for its weights and its KV cache, so ``device`` is None (the
backend's choice), ``"cpu"``, or a CUDA device this machine has (``"cuda"``, ``"cuda:N"`` with N
below ``torch.cuda.device_count()``), as a string or a ``torch.device``.  Anything else -- a
typo, ``"meta"`` (no memory), a GPU index past the last one, ``"cuda"`` on a machine without a
GPU or a torch built without CUDA -- gets one ``ValueError`` naming the device and listing the
devices there are, instead of whatever torch raises the first time a tensor is moved there.
"""

from __future__ import annotations

import torch


def available_devices() -> list[str]:
    """The devices an Engine can use here: ``cpu`` and each visible CUDA device."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + [f"cuda:{i}" for i in range(count)]


def check_device(device) -> None:
    """Refuse a ``device`` the engine cannot run on (see the module docstring)."""
    if device is None:
        return
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0' (or a torch.device), "
                        f"got {type(device).__name__}")
    here = ", ".join(available_devices())
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"device {device!r} is not a device name: use one of {here}") from None
    if parsed.type == "cpu":
        return
    if parsed.type != "cuda":
        why = " (a meta tensor holds no data)" if parsed.type == "meta" else ""
        raise ValueError(f"device {device!r}: the engine runs on the CPU or a CUDA GPU{why}; "
                         f"this machine has {here}")
    if not torch.cuda.is_available():
        reason = "this torch was built without CUDA" if torch.version.cuda is None else \
            "no CUDA GPU is visible (driver, CUDA_VISIBLE_DEVICES?)"
        raise ValueError(f"device {device!r}: {reason}; use device='cpu' (available: {here})")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"device {device!r}: this machine has {count} CUDA device(s), "
                         f"cuda:0 to cuda:{count - 1} (available: {here})")
