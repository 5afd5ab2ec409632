"""DecodeRows: the host lists a decode step feeds the model, kept from one step to the next.

A decode step needs, for every running request in order, its last token, that token's
position, its cache slot, its temperature and top_p, and whether some request needs more of the sampler.  Built from the requests, that is one
pass over them per list, every step.  But between two decode steps little changes: each
request gains one token (known to the scheduler's commit, which loops over the batch anyway)
and the rest stays.  So the commit hands the next step its rows (``advanced``): the new tokens
and positions it collected, the slots and sampling parameters carried over, with the rows of
finished requests left out.  The scheduler uses them only while its running list is still
exactly the requests they were made for (``Scheduler.schedule``); after an admission, a
preemption or a rollback it builds them afresh (``of``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_tutorial.engine.request import Request


@dataclass
class DecodeRows:
    """Row i describes ``requests[i]`` (a running request) for the next decode step."""
    requests: list[Request]
    token_ids: list[int]                 # its last token (the one this step computes)
    positions: list[int]                 # that token's position: num_computed_tokens
    slots: list[int]                     # its block-table row
    temperature: list[float]             # SamplingParams.effective_temperature (0: greedy)
    top_p: list[float]
    samples: bool                        # some request samples: uniforms must be drawn
    controlled: bool                     # some request needs sampling controls (top-k, min-p,
    #                                      penalties, min_tokens, processors, logprobs)
    #: a step scheduled ahead (``Scheduler.schedule_ahead``): the row of the step in flight
    #: that row i continues, whose sampled token is its input (``token_ids`` are not known yet)
    source_rows: list[int] | None = None

    @classmethod
    def of(cls, requests: list[Request]) -> "DecodeRows":
        """The rows read from the requests themselves."""
        temperature = [r.params.effective_temperature for r in requests]
        samples = any(temperature)
        return cls(list(requests), [r.output_ids[-1] for r in requests],
                   [r.num_computed_tokens for r in requests], [r.slot for r in requests],
                   temperature, [r.params.top_p for r in requests], samples,
                   any(r.params.needs_sampling_controls for r in requests))

    def advanced(self, token_ids: list[int], positions: list[int],
                 kept: list[int] | None) -> "DecodeRows":
        """The rows of the next step, after this one committed: ``token_ids`` and
        ``positions`` are those of the requests that go on, which are all of them (``kept``
        None) or rows ``kept`` of this step."""
        if kept is None:
            return DecodeRows(self.requests, token_ids, positions, self.slots,
                              self.temperature, self.top_p, self.samples, self.controlled)
        temperature = [self.temperature[i] for i in kept]
        samples = self.samples and any(temperature)
        requests = [self.requests[i] for i in kept]
        return DecodeRows(requests, token_ids, positions, [self.slots[i] for i in kept],
                          temperature, [self.top_p[i] for i in kept], samples,
                          self.controlled and
                          any(r.params.needs_sampling_controls for r in requests))

    def ahead(self, kept: list[int], positions: list[int]) -> "DecodeRows":
        """The rows of the step after this one, scheduled before this one is committed: rows
        ``kept`` of this step, at ``positions``, each continuing its own row (whose token
        is not known on the host yet)."""
        return DecodeRows([self.requests[i] for i in kept], [-1] * len(kept), positions,
                          [self.slots[i] for i in kept], [self.temperature[i] for i in kept],
                          [self.top_p[i] for i in kept], self.samples, self.controlled,
                          source_rows=list(kept))
