"""What the first ``generate``, ``stream`` or ``chat`` would import, imported when the engine is
built instead.

Python imports a module once, the first time it is asked for; an exception that arrives in the
middle of that first import (Ctrl-C: a ``KeyboardInterrupt`` at any instant) leaves the module
half-initialised in ``sys.modules``, and every later use fails with "partially initialized
module".  So nothing on the serving path may import for the first time after construction:
``prepare_first_call`` runs, at construction, everything that imports lazily there:

- the torch backend on the CPU: the compiled matrix-vector products (``cpu_matvec.py`` over
  float32 values, ``cpu_quantized.py`` over a GGUF's blocks: Numba, imported and each product
  compiled, or read from Numba's disk cache, by one tiny product) and the compiled norms, RoPE
  and attention of a decode step (``cpu_decode_ops.py``);
- the tokenizer's chat template: compiled and rendered once (Jinja2 and what rendering
  imports); a template that fails is left to fail, with its own message, when it is used;
- a backend that compiles kernels: the modules Numba's argument typing imports at a kernel's
  first launch (``NUMBA_LAUNCH_TYPING``; found on a GPU by the test below).

``tests/engine/test_interrupts.py`` checks that ``sys.modules`` does not grow on the first
call after construction, and interrupts calls at random instants, the first included.
"""

from __future__ import annotations

import importlib

import torch

from paged_tutorial.backends import cpu_decode_ops, cpu_matvec, cpu_quantized
from paged_tutorial.backends.base import Backend
from paged_tutorial.loading.tokenizer import Tokenizer

#: modules Numba's typing of launch arguments imports the first time a kernel is launched
NUMBA_LAUNCH_TYPING = ("numba.core.typing.bufproto", "numba.core.typing.cffi_utils")


def prepare_first_call(backend: Backend, tokenizer: Tokenizer) -> None:
    """Import (and compile) now what the first call on ``backend`` with ``tokenizer`` would."""
    if backend.device.type == "cpu":
        one = torch.zeros(1, 1, dtype=torch.float32)
        cpu_matvec.matvec(one, one)
        cpu_quantized.compile_products()
        cpu_decode_ops.compile_ops()
    if backend.compiles_kernels:
        for name in NUMBA_LAUNCH_TYPING:
            importlib.import_module(name)
    if isinstance(getattr(tokenizer, "chat_template", None), str) and tokenizer.chat_template:
        try:
            tokenizer.render_chat("Hello")
        except Exception:       # the template's fault: reported when a chat uses it
            pass
