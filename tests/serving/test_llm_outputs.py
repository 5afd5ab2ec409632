"""vLLM's surface on pt.LLM: logprobs in vLLM's shape, penalties, min_tokens with stop tokens
and stop strings, TokensPrompt, RequestOutput.metrics, chat over several conversations with
vLLM's keyword arguments."""

from __future__ import annotations

import math

import pytest

import paged_tutorial as pt


def test_tokens_prompt_is_importable_where_vllm_has_it(llm):
    from paged_tutorial import TokensPrompt
    from paged_tutorial.inputs import TextPrompt, TokensPrompt as same

    assert TokensPrompt is same
    ids = llm.get_tokenizer().encode("The capital of France is", add_special_tokens=True)
    by_ids, by_text = llm.generate([TokensPrompt(prompt_token_ids=ids),
                                    TextPrompt(prompt="The capital of France is")],
                                   pt.SamplingParams(max_tokens=5))
    assert by_ids.prompt is None and by_ids.prompt_token_ids == ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_logprobs_come_in_vllms_shape(llm):
    out = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=5, temperature=1.0, seed=2, logprobs=3, prompt_logprobs=1))[0]
    completion = out.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids) == 5
    tokenizer = llm.get_tokenizer()
    for token, position in zip(completion.token_ids, completion.logprobs):
        assert list(position)[0] == token                  # the sampled token first
        assert len(position) in (3, 4)                     # + the top 3 (it may be one)
        ranked = sorted(position.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked][:3] == [1, 2, 3]
        assert all(lp.logprob <= 0 for lp in ranked)
        assert position[token].decoded_token == tokenizer.decode([token],
                                                                 skip_special_tokens=False)
    assert completion.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs)))
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert token in position and 1 <= len(position) <= 2
    plain = llm.generate(["Hello there"], pt.SamplingParams(max_tokens=2))[0]
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None
    assert plain.prompt_logprobs is None


def test_logprobs_stop_where_a_stop_token_cuts_the_answer(llm):
    free = llm.generate(["Hello there"], pt.SamplingParams(max_tokens=6, ignore_eos=True))[0]
    stop_at = free.outputs[0].token_ids[2]
    cut = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=6, ignore_eos=True, stop_token_ids=[stop_at], logprobs=1))[0].outputs[0]
    n = free.outputs[0].token_ids.index(stop_at) + 1
    assert cut.token_ids == free.outputs[0].token_ids[:n] and len(cut.logprobs) == n


def test_min_tokens_holds_stop_tokens_and_stop_strings_back(llm):
    free = llm.generate(["Hello there"], pt.SamplingParams(max_tokens=8, ignore_eos=True))[0]
    first = free.outputs[0].token_ids[0]
    stopped = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=8, ignore_eos=True, stop_token_ids=[first]))[0].outputs[0]
    held = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=8, ignore_eos=True, stop_token_ids=[first], min_tokens=4))[0].outputs[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4
    text = free.outputs[0].text
    word = text[:2]
    early = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=8, ignore_eos=True, stop=[word]))[0].outputs[0]
    late = llm.generate(["Hello there"], pt.SamplingParams(
        max_tokens=8, ignore_eos=True, stop=[word], min_tokens=8))[0].outputs[0]
    assert early.finish_reason == "stop" and early.text == ""
    assert late.finish_reason == "length" and late.text == text


def test_penalties_reach_the_sampler_through_llm(llm):
    params = dict(max_tokens=12, ignore_eos=True)
    plain = llm.generate(["Hello there"], pt.SamplingParams(**params))[0].outputs[0]
    # this random model hardly repeats itself: negative penalties make it
    repeating = llm.generate(["Hello there"], pt.SamplingParams(
        presence_penalty=-2.0, frequency_penalty=-2.0, **params))[0].outputs[0]
    assert len(set(repeating.token_ids)) < len(set(plain.token_ids))


def test_metrics_follow_the_request_through_the_engine(llm):
    out = llm.generate(["Hello there"], pt.SamplingParams(max_tokens=3))[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert m.time_in_queue == pytest.approx(m.first_scheduled_time - m.arrival_time)
    assert m.last_token_time == m.finished_time
    import time
    assert abs(m.finished_time - time.time()) < 60          # seconds since the epoch


def test_chat_serves_a_list_of_conversations_with_vllms_keywords(llm):
    conversations = [[{"role": "user", "content": "Hi!"}],
                     [{"role": "user", "content": "Name a color."},
                      {"role": "assistant", "content": "My favourite color is"}]]
    outs = llm.chat(conversations, pt.SamplingParams(max_tokens=3))
    assert len(outs) == 2 and all(o.prompt.endswith("<|im_start|>assistant\n") for o in outs)
    no_header = llm.chat(conversations[0], pt.SamplingParams(max_tokens=3),
                         add_generation_prompt=False)[0]
    assert no_header.prompt.endswith("<|im_end|>\n")
    open_turn = llm.chat(conversations[1], pt.SamplingParams(max_tokens=3),
                         add_generation_prompt=False, continue_final_message=True)[0]
    assert open_turn.prompt.endswith("<|im_start|>assistant\nMy favourite color is")
    custom = llm.chat(conversations[0], pt.SamplingParams(max_tokens=3),
                      chat_template="{% for m in messages %}{{ shout }}{{ m['content'] }}"
                                    "{% endfor %}",
                      chat_template_kwargs={"shout": ">> "})[0]
    assert custom.prompt == ">> Hi!"
    with pytest.raises(ValueError, match="add_generation_prompt=False"):
        llm.chat(conversations[1], add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        llm.chat(conversations[0], chat_template_kwargs=["x"])
