"""Logprobs as vLLM reports them: the chosen token's and the most likely tokens', with ranks.

They are the model's own distribution, ``log_softmax`` of the raw float32 logits, before
temperature, penalties, logits processors, top-k / min-p / top-p change what is drawn (vLLM's
default ``logprobs_mode="raw_logprobs"``).  The rank of a token is how many tokens are at least
as likely as it (1 for the most likely; ties share the larger rank, as vLLM counts them).

``top_logprobs(logits, token_ids, k)`` computes them for every row at once on the logits'
device; column 0 is the chosen token of the row, columns 1..k the k most likely tokens in
order (k = 0: the chosen token alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TopLogprobs:
    token_ids: torch.Tensor              # int64 [B, 1 + k]: the chosen token, then the top k
    logprobs: torch.Tensor               # float32 [B, 1 + k]
    ranks: torch.Tensor                  # int64 [B, 1 + k]

    def rows(self) -> list[list[tuple[int, float, int]]]:
        """Host lists: per row, (token id, logprob, rank) for the chosen token, then the top k
        (one device-to-host copy per tensor)."""
        ids, values, ranks = (self.token_ids.tolist(), self.logprobs.tolist(),
                              self.ranks.tolist())
        return [list(zip(i, v, r)) for i, v, r in zip(ids, values, ranks)]


def top_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> TopLogprobs:
    """logits [B, V] (any float dtype), token_ids [B] -> the chosen tokens' logprobs and the top
    ``k`` of every row (see the module docstring)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen_ids = token_ids.reshape(-1, 1).long()
    chosen = logprobs.gather(1, chosen_ids)
    chosen_rank = (logprobs >= chosen).sum(dim=-1, keepdim=True)
    top_values, top_ids = torch.topk(logprobs, k, dim=-1) if k > 0 else \
        (logprobs[:, :0], chosen_ids[:, :0])
    # the rank of the i-th most likely: every token at least as likely (ties included)
    top_ranks = [(logprobs >= top_values[:, i:i + 1]).sum(dim=-1, keepdim=True)
                 for i in range(k)]
    return TopLogprobs(torch.cat([chosen_ids, top_ids.long()], dim=1),
                       torch.cat([chosen, top_values], dim=1),
                       torch.cat([chosen_rank, *top_ranks], dim=1))
