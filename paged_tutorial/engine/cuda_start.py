"""Starting CUDA in a background thread while the main thread carries on importing.

A process's first CUDA allocation creates the GPU's context (driver start-up, a few hundred
milliseconds), and torch does it with Python's lock released.  The command line asks for it
in a thread just before it imports and test-launches its backend (Numba's import is seconds of
Python): the two overlap, and the backend's first tensor finds the context made.

Nothing depends on the thread: when there is no GPU, or CUDA fails to start, it does nothing
and the backend's own checks report the problem as they would without it.  ``wait`` returns
once the thread is done (tests use it; the engine never needs to).
"""

from __future__ import annotations

import threading

import torch


class CudaStart:
    """One background thread that makes the CUDA context of ``device`` (default: the current
    device) when this machine has a GPU."""

    def __init__(self, device: str = "cuda"):
        self.device = device
        self.error: BaseException | None = None
        self.started = False
        self._thread = threading.Thread(target=self._run, name="cuda-start", daemon=True)

    def start(self) -> "CudaStart":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if torch.cuda.is_available():
                torch.empty(1, device=self.device)       # the allocation creates the context
                self.started = True
        except Exception as exc:             # the backend's checks report it on the main thread
            self.error = exc

    def wait(self, timeout: float | None = None) -> bool:
        """True once the thread has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
