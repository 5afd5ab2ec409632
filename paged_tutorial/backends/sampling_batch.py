"""What the sampler is given for one step's rows, and what it gives back.

``SamplingBatch`` holds, per row of logits, the temperature, top_p and uniform the sampling
rule reads (``sampling_rule.py``), and, when some request of the batch needs more,
``LogitsControls`` (``logits_controls.py``): top-k / min-p, penalties, ``min_tokens``, logits
processors, logprobs.  ``Backend.sample_batch`` (``base.py``) takes it: a batch with no controls
goes to the backend's own ``sample`` (a kernel on the numba backend, captured in the decode
CUDA graphs), a batch with controls to the batched torch rule on the backend's device, eagerly.

``SamplerOutput`` is the sampled token per row and, when asked for, the logprobs of each row
(``logprobs.py``), still on the device: the model runner reads them back in one go.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_tutorial.backends.logits_controls import LogitsControls
from paged_tutorial.backends.logprobs import TopLogprobs


@dataclass
class SamplingBatch:
    temperature: torch.Tensor            # float32 [B]: 0 for greedy rows
    top_p: torch.Tensor                  # float32 [B]
    uniforms: torch.Tensor               # float32 [B]: each row's uniform for this token
    controls: LogitsControls | None = None   # None: temperature and top_p are all there is

    @property
    def graph_capturable(self) -> bool:
        """The batch is sampled by the backend's own ``sample`` alone (which a decode CUDA
        graph captures); with controls it runs eagerly."""
        return self.controls is None


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor              # int64 [B]: the sampled token of each row
    logprobs: TopLogprobs | None = None  # when some row asked for logprobs
