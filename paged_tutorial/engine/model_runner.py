"""ModelRunner: turns a scheduled batch into device inputs, runs the network, samples.

A step's inputs are one ``StepInputs`` (``step_inputs.py``), sent to the device in one
copy.  For a prefill it packs the new tokens of every admitted request into one batch
(positions from each request's ``num_computed_tokens``, the slot of every token, ``cu_seqlens``
boundaries) and asks for logits at each sequence's last row only.  A request admitted with part
of its prompt found in the prefix cache starts at that ``num_computed_tokens``; its attention
reads the cached part from the paged cache.  For a decode it takes each running request's last
token, position, slot and sampling parameters from the batch's ``DecodeRows`` (kept by the
scheduler from one step to the next, ``decode_rows.py``) and replays a captured CUDA graph
when the engine has them (``cuda_graphs.py``), else runs the layers eagerly.  Sampling follows
``backends/sampling_rule.py``'s rule with each request's own random stream, so a request gets
the same tokens whatever batch it shares.  The runner samples through the backend's one call,
``Backend.sample_batch``: it hands over the rows' temperature, top_p and uniforms and, when
some request needs more (top-k, min-p, penalties, ``min_tokens``, logits processors, logprobs),
the batch's ``LogitsControls`` (``sampling_controls.py``); the backend decides how to draw.  A
decode batch with controls is not replayed from a graph (a replay calls no Python).

On the CPU the runner chooses torch's thread count when it is built and looks again before each
step (``threads.py``: the user's choice first, else what the other processes leave free).

A run is two calls: ``launch`` queues it on the device and returns (on a CPU it has run by
then), ``collect`` waits for it and reads the tokens back.  Between the two the engine may
launch the next decode step (asynchronous scheduling, ``engine_core.py``): ``launch(batch,
after=...)`` takes that step's input tokens from the earlier step's sampled ids on the device.

The runner changes nothing but the cache's K/V contents: tokens are appended and requests
finished by the scheduler, after the step has succeeded.

``phase_seconds`` says where the last collected run spent its time, on the host's clock: ``inputs``
(packing the step and syncing the block table), ``forward`` (the layers; on a GPU, the time to
enqueue their kernels), ``sample`` (sampling and reading the tokens back: on a GPU, this is
where the host waits for the kernels still running), or ``graph`` for a replayed decode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.logits_controls import LogitsProcessorError
from paged_tutorial.backends.logprobs import top_logprobs
from paged_tutorial.backends.sampling_batch import SamplingBatch
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.model.decoder import build_network
from paged_tutorial.loading.models import Model
from paged_tutorial.engine.decode_rows import DecodeRows
from paged_tutorial.engine.request import Request, RequestError
from paged_tutorial.engine.sampling_controls import sampling_controls
from paged_tutorial.backends.sampling_rule import request_uniform
from paged_tutorial.step_inputs import StepInputPacker, StepInputs
from paged_tutorial.threads import adapt_threads, configure_threads
from paged_tutorial.engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: Model, backend: Backend, cache: PagedKVCache, max_slots: int,
                 max_seq_len: int, cuda_graphs: bool = False):
        self.model = model
        self.backend = backend
        self.cache = cache
        self.max_seq_len = max_seq_len
        self.device = backend.device
        if self.device.type == "cpu":            # torch's CPU threads, chosen for this machine
            configure_threads()
        self.network = build_network(model, backend, max_positions=max_seq_len)
        #: builds each step's ``StepInputs``; counts its packs and host-to-device copies
        self.packer = StepInputPacker(self.device)
        #: host seconds of the last ``run``, per phase (see the module docstring)
        self.phase_seconds: dict[str, float] = {}
        self.graphs = None
        if cuda_graphs:
            from paged_tutorial.engine.cuda_graphs import DecodeGraphs
            self.graphs = DecodeGraphs(self.network, cache, max_slots)

    # --- inputs ----------------------------------------------------------------------------
    @staticmethod
    def sampling_inputs(requests: list[Request]):
        """Host lists (temperature, top_p, uniform) per request.  Greedy requests get
        temperature 0 and never use their uniform, so it is not drawn for them."""
        temperature = [r.params.effective_temperature for r in requests]
        return (temperature, [r.params.top_p for r in requests],
                ModelRunner.uniforms(requests, temperature))

    @staticmethod
    def uniforms(requests: list[Request], temperature: list[float],
                 ahead: int = 0) -> list[float]:
        """Each request's uniform for its next token (``ahead`` tokens later: a step launched
        before the one in flight was committed), 0.0 for the greedy ones (temperature 0),
        whose uniform is not drawn."""
        return [ModelRunner.uniform(r, ahead) if t > 0 else 0.0
                for r, t in zip(requests, temperature)]

    @staticmethod
    def uniform(request: Request, ahead: int = 0) -> float:
        """The request's uniform for its next token; a RequestError names the request if its
        stream cannot be drawn (its seed or sample_key was changed after validation)."""
        try:
            return request_uniform(request.params.seed, request.sample_key,
                                   len(request.output_ids) + ahead)
        except Exception as exc:
            raise RequestError(request, exc) from exc

    def prefill_inputs(self, requests: list[Request],
                       prompt_rows: "PromptLogprobRows | None" = None) -> StepInputs:
        """The tokens of each request whose K/V are not computed yet (a recomputed, preempted,
        request replays what it generated), after its ``num_computed_tokens``; logits for each
        request's last token, and for every prompt token of those asking for
        ``prompt_logprobs`` (``prompt_rows``)."""
        return self.packer.prefill([r.all_ids[r.num_computed_tokens:] for r in requests],
                                   [r.num_computed_tokens for r in requests],
                                   [r.slot for r in requests], self.cache.device_block_table(),
                                   self.sampling_inputs(requests),
                                   logit_rows=prompt_rows.rows if prompt_rows else None)

    @staticmethod
    def decode_rows(requests: list[Request]) -> tuple[list[int], list[int], list[int]]:
        """Host lists (last token, its position, cache slot) per running request."""
        return ([r.output_ids[-1] for r in requests], [r.num_computed_tokens for r in requests],
                [r.slot for r in requests])

    def decode_inputs(self, requests: list[Request]) -> StepInputs:
        """Each running request's last token, at its next position."""
        return self.packer.decode(*self.decode_rows(requests), self.cache.device_block_table(),
                                  self.sampling_inputs(requests))

    # --- one step --------------------------------------------------------------------------
    def launch(self, batch: ScheduledBatch, after: "LaunchedRun | None" = None) -> LaunchedRun:
        """Queue the batch's model run on the device and return without reading anything
        back (on a CPU the run is done when this returns).  ``after``: a decode step launched
        earlier and not committed yet; this batch is then a decode whose ``rows.source_rows``
        say which of that step's rows each of its requests continues, its input tokens are
        that step's sampled ids, taken on the device, and its positions and uniforms are
        already one token further (``Scheduler.schedule_ahead``)."""
        requests = batch.requests
        self.phase_seconds = {}
        if self.device.type == "cpu":
            adapt_threads()
        t0 = time.perf_counter()
        prompt_rows = None
        ahead = int(after is not None)
        if batch.kind == "decode":
            rows = batch.rows if batch.rows is not None else DecodeRows.of(requests)
            sampling = (rows.temperature, rows.top_p,
                        self.uniforms(requests, rows.temperature, ahead) if rows.samples
                        else [0.0] * len(requests))
            if self.graphs is not None and not rows.controlled:
                graph_run = self.graphs.launch(
                    rows.token_ids, rows.positions, rows.slots, *sampling,
                    after=None if after is None else after.graph_run,
                    source_rows=rows.source_rows if after is not None else None)
                return LaunchedRun(batch, graph_run.token_ids, graph_run=graph_run,
                                   phase_seconds={"launch": time.perf_counter() - t0},
                                   ahead=bool(ahead))
            inputs = self.packer.decode(rows.token_ids, rows.positions, rows.slots,
                                        self.cache.device_block_table(), sampling)
            if after is not None:                # the previous step's tokens, on the device
                source = torch.tensor(rows.source_rows, device=after.token_ids.device)
                inputs.token_ids.copy_(after.token_ids.index_select(0, source))
            controlled = rows.controlled
        else:
            if after is not None:
                raise ValueError("only a decode step is launched after another")
            prompt_rows = PromptLogprobRows.of(requests)
            inputs = self.prefill_inputs(requests, prompt_rows)
            controlled = any(r.params.needs_sampling_controls for r in requests)
        t1 = time.perf_counter()
        logits = self.network.forward(inputs, self.cache)
        t2 = time.perf_counter()
        all_logits = logits
        if prompt_rows:
            logits = all_logits[prompt_rows.last_rows]
        controls = sampling_controls(requests, logits.device, logits.shape[-1],
                                     self.model.config.eos_token_ids) if controlled else None
        try:
            sampled = self.backend.sample_batch(logits, SamplingBatch(
                inputs.temperature, inputs.top_p, inputs.uniforms, controls))
        except LogitsProcessorError as exc:
            raise RequestError(requests[exc.row], exc) from exc
        return LaunchedRun(batch, sampled.token_ids, logits=logits, all_logits=all_logits,
                           finite=torch.isfinite(logits).all(dim=-1), sampled=sampled,
                           prompt_rows=prompt_rows, ahead=bool(ahead),
                           phase_seconds={"inputs": t1 - t0, "forward": t2 - t1,
                                          "sample": time.perf_counter() - t2})

    def collect(self, launched: LaunchedRun) -> RunOutput:
        """Wait for a launched run and read back one sampled token per request, the logits,
        whether each row of logits is finite, and the logprobs that requests asked for.
        ``phase_seconds`` then holds the launch's phases and ``graph`` or ``sample`` (where
        the host waited for the device); for a run launched ahead, whose launch an earlier
        step's report counts (``launch_ahead``), only the wait."""
        t0 = time.perf_counter()
        phases = {} if launched.ahead else dict(launched.phase_seconds)
        if launched.graph_run is not None:
            logits, tokens, finite = self.graphs.collect(launched.graph_run)
            phases["graph"] = phases.pop("launch", 0.0) + time.perf_counter() - t0
            self.phase_seconds = phases
            return RunOutput(tokens, logits, finite)
        tokens, finite = read_back(launched.token_ids, launched.finite)
        sampled, prompt_rows = launched.sampled, launched.prompt_rows
        logprobs = sampled.logprobs.rows() if sampled.logprobs is not None else None
        prompt_logprobs = prompt_rows.logprobs(launched.all_logits) if prompt_rows else None
        phases["sample"] = phases.get("sample", 0.0) + time.perf_counter() - t0
        self.phase_seconds = phases
        return RunOutput(tokens, launched.logits, finite, logprobs, prompt_logprobs)


@dataclass
class LaunchedRun:
    """A model run queued on the device by ``ModelRunner.launch``, not read back yet."""
    batch: ScheduledBatch
    token_ids: torch.Tensor              # [n] the sampled ids, on the device
    graph_run: object | None = None      # a replayed decode: ``cuda_graphs.GraphRun``
    logits: torch.Tensor | None = None   # the eager path's: the rows sampled from,
    all_logits: torch.Tensor | None = None    # every row computed (prompt logprobs),
    finite: torch.Tensor | None = None   # whether each sampled-from row is finite,
    sampled: object | None = None        # the backend's ``SamplerOutput``
    prompt_rows: "PromptLogprobRows | None" = None
    phase_seconds: dict = field(default_factory=dict)
    ahead: bool = False                  # launched before the step it continues was collected


class PromptLogprobRows:
    """Which logits rows a prefill needs when some request asks for ``prompt_logprobs``: all
    the rows of that request's prompt (row p gives the logprobs of prompt token p + 1), and the
    last row of every request (its first generated token).  A request gets its prompt logprobs
    at its first prefill only (``Request.prompt_logprobs`` stays as committed after a
    preemption)."""

    def __init__(self, requests: list[Request]):
        self.requests = requests
        self.wanted = [r.params.prompt_logprobs is not None and r.prompt_logprobs is None
                       and r.num_computed_tokens == 0 for r in requests]
        self.rows: list[int] = []            # packed-token rows that get logits
        self.last_rows: list[int] = []       # each request's last row, among ``rows``
        self.prompt_spans: list[tuple[int, int] | None] = []   # its prompt rows in ``rows``
        start = 0
        for request, wanted in zip(requests, self.wanted):
            n = request.total_len - request.num_computed_tokens
            if wanted:
                first = len(self.rows)
                self.rows += range(start, start + n)
                self.prompt_spans.append((first, first + len(request.prompt_ids) - 1))
            else:
                self.rows.append(start + n - 1)
                self.prompt_spans.append(None)
            self.last_rows.append(len(self.rows) - 1)
            start += n

    @classmethod
    def of(cls, requests: list[Request]) -> "PromptLogprobRows":
        return cls(requests)

    def __bool__(self) -> bool:
        return any(self.wanted)

    def logprobs(self, logits: torch.Tensor) -> list[list | None]:
        """Per request: None, or its prompt logprobs (None for the first position, then the
        (token id, logprob, rank) rows of ``top_logprobs`` for every later prompt token)."""
        out = []
        for request, span in zip(self.requests, self.prompt_spans):
            if span is None:
                out.append(None)
                continue
            targets = torch.tensor(request.prompt_ids[1:], device=logits.device)
            rows = top_logprobs(logits[span[0]:span[1]], targets,
                                request.params.prompt_logprobs).rows() if len(targets) else []
            out.append([None] + rows)
        return out


@dataclass
class RunOutput:
    """What one model run gives the engine."""
    token_ids: list[int]                 # one sampled token per request
    logits: torch.Tensor                 # [B, V] in the model dtype
    finite: list[bool]                   # row b of logits holds no NaN or inf
    #: per request, (token id, logprob, rank) of the sampled token then the top ones, when
    #: some request of the batch asked for logprobs (``backends/logprobs.py``)
    logprobs: list[list[tuple[int, float, int]]] | None = None
    #: per request, None or its prompt logprobs (a prefill only)
    prompt_logprobs: list[list | None] | None = None


def read_back(token_ids: torch.Tensor, finite: torch.Tensor) -> tuple[list[int], list[bool]]:
    """The sampled ids and the finite flags as host lists, in one device-to-host copy when
    both live on the same device (the flags ride along with the read the step makes anyway)."""
    if token_ids.device == finite.device:
        both = torch.cat([token_ids.reshape(-1).long(), finite.long()]).tolist()
        n = len(both) // 2
        return [int(t) for t in both[:n]], [bool(f) for f in both[n:]]
    return [int(t) for t in token_ids.tolist()], [bool(f) for f in finite.tolist()]


def record_logprobs(requests: list[Request], output: RunOutput, skipped) -> None:
    """Give each request of a committed step its logprobs (the ``skipped`` ones got no token)."""
    for i, request in enumerate(requests):
        if request in skipped:
            continue
        request.record_logprobs(None if output.logprobs is None else output.logprobs[i],
                                None if output.prompt_logprobs is None
                                else output.prompt_logprobs[i])
