"""The engine puzzles (06.table_sync, 06.allocator, 09.can_share) run scenarios drawn afresh
for every check, named with their seed in the verdict: an answer that memorised what one check
asked of it (the entries a sync copied, the token chains a rule shared) is refused by the next
check, and the allocator's run always meets 0 < free < needed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.cache import CacheFullError
from paged_tutorial.teaching.chapters import puzzle
from paged_tutorial.teaching.harness.base import Wrong
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator, table_sync
from paged_tutorial.teaching.chapters.ch09_prefix_sharing import prefix_sharing


def test_table_sync_draws_a_new_layout_and_stream_every_check():
    first, second = table_sync.draw_scenario(), table_sync.draw_scenario()
    assert first.seed != second.seed and first.requests != second.requests
    for _ in range(20):
        s = table_sync.draw_scenario()
        assert len(s.requests) > s.max_slots                    # slots and blocks are reused
        (prompt, new), bs = s.requests[0], s.block_size
        assert len(prompt) % bs and len(prompt) + new > -(-len(prompt) // bs) * bs
        assert all(len(p) + m <= s.max_seq_len for p, m in s.requests)
        assert f"seed {s.seed}" in s.describe()


def test_allocator_draws_a_stream_that_runs_short_of_blocks_but_not_out():
    for _ in range(5):
        s = allocator.draw_scenario()
        allocator._FindsShortfall.shortfalls = 0
        allocator.run(allocator._engine(s, lambda c, t, e: allocator._FindsShortfall(c, t, e)),
                      s.requests)
        assert allocator._FindsShortfall.shortfalls > 0
        assert f"seed {s.seed}" in s.describe()
    assert allocator.draw_scenario(8).block_size == 8


class _RebindsTheFreeList(allocator.AllocatorBase):
    """Releases into a new list bound to self.free_blocks rather than pushing onto the old one:
    nothing in the engine keeps the list object (the cache, the scheduler and the checks read
    allocator.free_blocks afresh, and the cache itself rebinds it), so this is right."""

    def ensure_capacity(self, slot, new_len):
        c, entries = self.config, self.table.entries
        todo = [(layer, lb) for layer in range(c.num_layers)
                for lb in range(c.blocks_for_tokens(new_len)) if entries[slot, layer, lb] < 0]
        if len(todo) > len(self.free_blocks):
            raise CacheFullError(f"{len(todo)} blocks needed")
        for layer, lb in todo:
            self.table.assign(slot, layer, lb, self.free_blocks.pop())

    def release(self, slot):
        c = self.config
        pushed = [self.table.unassign(slot, layer, lb) for layer in range(c.num_layers)
                  for lb in range(c.MAX_BLOCKS_PER_SEQ) if self.table.entries[slot, layer, lb] >= 0]
        self.free_blocks = [*self.free_blocks, *pushed]
        return pushed


class _CapsAtTheRow(_RebindsTheFreeList):
    """Grows at most to the table's row (MAX_BLOCKS_PER_SEQ) and never checks the length:
    the engine never asks for more than max_seq_len tokens (admission refuses a prompt that
    long, a request retires at max_seq_len), and up to there the cap changes nothing."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        n = min(c.blocks_for_tokens(new_len), c.MAX_BLOCKS_PER_SEQ)
        todo = [(layer, lb) for layer in range(c.num_layers) for lb in range(n)
                if self.table.entries[slot, layer, lb] < 0]
        if len(todo) > len(self.free_blocks):
            raise CacheFullError(f"{len(todo)} blocks needed")
        for layer, lb in todo:
            self.table.assign(slot, layer, lb, self.free_blocks.pop())


@pytest.mark.parametrize("answer", [_RebindsTheFreeList, _CapsAtTheRow])
def test_allocators_that_differ_only_where_the_engine_never_looks_are_right(answer):
    verdict = ex.grade("06.allocator", answer)
    assert verdict.status == "correct", verdict.message


def test_can_share_draws_new_chains_and_two_block_sizes_every_check():
    first, second = prefix_sharing.draw_scenarios(), prefix_sharing.draw_scenarios()
    assert [s.prompts for s in first] != [s.prompts for s in second]
    sizes = set()
    for _ in range(20):
        drawn = prefix_sharing.draw_scenarios()
        assert drawn[0].block_size != drawn[2].block_size
        sizes |= {s.block_size for s in drawn}
        assert all(len(p) + s.max_tokens <= prefix_sharing.MAX_SEQ_LEN
                   for s in drawn for p in s.prompts)
        system = drawn[2].prompts[2]
        assert len(system) % drawn[2].block_size == 0              # exactly its full blocks
    assert sizes == set(prefix_sharing.BLOCK_SIZE_CHOICES)         # 12 among them
    rng = np.random.default_rng(0)
    for _ in range(10):                # the host probe: a block size that is not a power of two
        (_, args), *_ = prefix_sharing.probe_cases(rng)
        assert args[-1] & (args[-1] - 1)


def test_can_share_asks_block_0_about_a_block_found_deeper_in_another_prompt():
    """Every check: a prompt begins with a block the first prompt holds past its block 0 (under
    the chain-blind hash its key finds that record: same tokens, a parent, nothing shared
    before), and the host probe asks block 0 about such a record."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        blind = prefix_sharing.draw_scenarios()[0]
        bs, first = blind.block_size, blind.prompts[0]
        deeper = {tuple(first[j * bs:(j + 1) * bs]) for j in range(1, len(first) // bs)}
        assert any(tuple(p[:bs]) in deeper for p in blind.prompts[1:]), blind.prompts
        asked = [args for _, args in prefix_sharing.probe_cases(rng)
                 if args[3] == 0 and args[2] is None and args[0].parent is not None]
        assert asked and all(found.tokens == tokens for found, tokens, *_ in asked)


def test_a_table_sync_that_replays_the_entries_one_check_copied_is_refused():
    script = []

    def recording(host, device, changed):
        script.append(list(changed))
        for i in changed:
            device[i] = host[i]
    # a check refuses the recording outright (it keeps a list between calls); its grader alone
    # shows that the next check draws another run, which the replay gets wrong
    assert "keeps state" in ex.grade("06.table_sync", recording).message
    puzzle("06.table_sync").grader(recording)
    calls = itertools.count()

    def replays(host, device, changed):
        k = next(calls)
        for i in (script[k] if k < len(script) else []):
            if i < len(host):
                device[i] = host[i]
    verdict = ex.grade("06.table_sync", replays)
    assert verdict.status == "wrong" and "keeps state" in verdict.message, verdict.message
    with pytest.raises(Wrong, match="seed "):
        puzzle("06.table_sync").grader(replays)


def test_a_share_rule_that_remembers_one_checks_chains_is_refused():
    shared = set()

    def recording(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
        answer = found.tokens == tokens and found.parent is previous and \
            (logical_block + 1) * BLOCK_SIZE < n_tokens
        if answer:
            shared.add((tuple(tokens), logical_block, n_tokens))
        return answer
    assert "keeps state" in ex.grade("09.can_share", recording).message
    puzzle("09.can_share").grader(recording)
    assert shared

    def remembers(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
        return (tuple(tokens), logical_block, n_tokens) in shared
    verdict = ex.grade("09.can_share", remembers)
    assert verdict.status == "wrong" and "keeps state" in verdict.message, verdict.message
    with pytest.raises(Wrong, match="seed "):
        puzzle("09.can_share").grader(remembers)


@pytest.mark.parametrize("name,answer", [
    ("06.allocator", "hard-coded BLOCK_SIZE 16"),
])
def test_an_allocator_hard_coded_to_the_old_run_names_the_drawn_layout(name, answer):
    from helpers.wrong_allocators import WRONG
    verdict = ex.grade(name, WRONG[answer])
    assert verdict.status == "wrong", verdict.message
    assert "BLOCK_SIZE 8" in verdict.message or "BLOCK_SIZE 12" in verdict.message
