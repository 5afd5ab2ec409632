"""pt.LLM: vLLM's generate/chat on this engine -- its results' shape, n, seeds, top-k, stop
strings and stop tokens, each checked against what the engine itself produces."""

from __future__ import annotations

import pytest

import paged_tutorial as pt
from paged_tutorial.serving.stop_text import StopText

PROMPTS = ["Hello there", "The capital of France is", "안녕하세요"]


def test_a_vllm_snippet_runs_with_only_its_import_changed(tiny_model):
    from paged_tutorial import LLM, SamplingParams      # was: from vllm import LLM, ...

    llm = LLM(model=tiny_model, backend="torch")
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, top_k=20, max_tokens=6,
                                     seed=0)
    outputs = llm.generate(PROMPTS, sampling_params)
    assert [o.prompt for o in outputs] == PROMPTS
    for output in outputs:
        completion = output.outputs[0]
        assert output.finished and completion.finish_reason == "length"
        assert len(completion.token_ids) == 6 and isinstance(completion.text, str)
        assert output.prompt_token_ids == tiny_model.tokenizer.encode(output.prompt,
                                                                      add_special_tokens=True)
    assert llm.engine.num_requests == 0 and llm.engine.cache.num_free == \
        llm.engine.cache.num_blocks


def test_greedy_answers_are_the_engines_own(llm):
    greedy = pt.SamplingParams(max_tokens=12)
    outputs = llm.generate(PROMPTS, greedy)
    engine_results = llm.engine.generate([o.prompt_token_ids for o in outputs], greedy,
                                         chat=False)
    for output, result in zip(outputs, engine_results):
        assert output.outputs[0].token_ids == result.token_ids
        assert output.outputs[0].text == result.text


def test_n_answers_per_prompt_each_reproducible_by_its_seed(llm):
    params = pt.SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8)
    first = llm.generate(PROMPTS[:2], params)
    again = llm.generate(PROMPTS[1:2], params)         # another batch, another position
    assert [len(o.outputs) for o in first] == [3, 3]
    assert [c.index for c in first[0].outputs] == [0, 1, 2]
    answers = [tuple(c.token_ids) for c in first[1].outputs]
    assert answers == [tuple(c.token_ids) for c in again[0].outputs]
    assert len(set(answers)) == 3                       # three different samples
    single = llm.generate(PROMPTS[1], pt.SamplingParams(temperature=1.0, seed=7,
                                                        max_tokens=8))
    assert single[0].outputs[0].token_ids == list(answers[0])


def test_top_k_of_one_is_greedy(llm):
    greedy = llm.generate(PROMPTS, pt.SamplingParams(max_tokens=8))
    top1 = llm.generate(PROMPTS, pt.SamplingParams(temperature=1.5, top_k=1, seed=3,
                                                   max_tokens=8))
    assert [o.outputs[0].token_ids for o in top1] == [o.outputs[0].token_ids for o in greedy]


def test_min_p_of_one_is_greedy(llm):
    greedy = llm.generate(PROMPTS, pt.SamplingParams(max_tokens=8))
    strict = llm.generate(PROMPTS, pt.SamplingParams(temperature=1.5, min_p=1.0, seed=3,
                                                     max_tokens=8))
    assert [o.outputs[0].token_ids for o in strict] == [o.outputs[0].token_ids for o in greedy]


def _token_texts(tokenizer, ids):
    """The text each token adds, as the engine's detokenizer streams it."""
    stream = tokenizer.stream()
    return [stream.step(t) for t in ids]


def test_a_stop_string_across_a_token_boundary_ends_the_answer_before_it(llm):
    full = llm.generate(PROMPTS[1], pt.SamplingParams(max_tokens=20))[0].outputs[0]
    pieces = _token_texts(llm.get_tokenizer(), full.token_ids)
    # a stop string that starts in the 4th token's text and ends in the 5th's
    start = sum(len(p) for p in pieces[:3]) + len(pieces[3]) - 1
    end = sum(len(p) for p in pieces[:4]) + 1
    stop = full.text[start:end]
    assert len(stop) == 2 and full.text.find(stop) == start
    free_before = llm.engine.cache.num_free
    out = llm.generate(PROMPTS[1], pt.SamplingParams(max_tokens=20, stop=[stop, "zzz"]))
    answer = out[0].outputs[0]
    assert answer.text == full.text[:start]
    assert (answer.finish_reason, answer.stop_reason) == ("stop", stop)
    assert answer.token_ids == full.token_ids[:5]       # it stopped at the 5th token
    assert llm.engine.cache.num_free == free_before and llm.engine.num_requests == 0


def test_a_stop_token_ends_the_answer_without_its_text(llm):
    full = llm.generate(PROMPTS[0], pt.SamplingParams(max_tokens=12))[0].outputs[0]
    stop_id = full.token_ids[3]
    assert stop_id not in full.token_ids[:3]
    answer = llm.generate(PROMPTS[0], pt.SamplingParams(max_tokens=12,
                                                        stop_token_ids=[stop_id]))[0].outputs[0]
    assert answer.token_ids == full.token_ids[:4]
    assert (answer.finish_reason, answer.stop_reason) == ("stop", stop_id)
    assert answer.text == llm.get_tokenizer().decode(full.token_ids[:3])


def test_stop_text_never_splits_a_multibyte_character_across_tokens(chat_tokenizer):
    text = "날씨가 좋네요. 안녕히 가세요!"
    ids = chat_tokenizer.encode(text)
    pieces = _token_texts(chat_tokenizer, ids)
    assert "".join(pieces) == text
    assert "" in pieces                     # some character's bytes span several tokens
    stop = "히 가"                           # spans tokens that carry parts of 히 and 가
    checker = StopText([stop, "없는 말"])
    shown = [checker.add(p) for p in pieces]
    assert "".join(shown) == text[:text.index(stop)] and checker.stop_reason == stop
    assert all("\ufffd" not in s for s in shown)
    # while it may still be a stop string's beginning, text is held back, never released
    held = StopText(["가세요?"])
    released = "".join(held.add(p) for p in pieces)
    assert released + held.flush() == text and held.stop_reason is None


def test_chat_takes_one_conversation_or_several(llm, chat_tokenizer):
    hi = [{"role": "user", "content": "Hi!"}]
    bye = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bye!"}]
    one = llm.chat(hi, pt.SamplingParams(max_tokens=5))
    both = llm.chat([hi, bye], pt.SamplingParams(max_tokens=5))
    assert len(one) == 1 and len(both) == 2
    assert one[0].prompt_token_ids == chat_tokenizer.apply_chat_template(hi)
    assert one[0].prompt == chat_tokenizer.render_chat(hi)
    assert both[0].outputs[0].token_ids == one[0].outputs[0].token_ids
    assert both[1].prompt_token_ids == chat_tokenizer.apply_chat_template(bye)


def test_token_id_prompts_and_per_prompt_params(llm):
    ids = llm.get_tokenizer().encode("Hello there", add_special_tokens=True)
    out = llm.generate([{"prompt_token_ids": ids}, {"prompt": "Hello there"}],
                       [pt.SamplingParams(max_tokens=3), pt.SamplingParams(max_tokens=5)])
    assert out[0].prompt is None and out[0].prompt_token_ids == ids
    assert out[0].outputs[0].token_ids == out[1].outputs[0].token_ids[:3]
    assert len(out[1].outputs[0].token_ids) == 5


def test_bad_input_is_refused_before_anything_is_queued(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": [5] * 200}])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(["fine", {"prompt_token_ids": [10 ** 7]}])
    with pytest.raises(TypeError, match="one per prompt"):
        llm.generate(["a", "b"], [pt.SamplingParams()])
    assert llm.engine.num_requests == 0 and not llm.engine.has_unfinished()


def test_the_step_level_engine_refuses_what_only_llm_applies(llm):
    for params in (pt.SamplingParams(stop=["x"]), pt.SamplingParams(stop_token_ids=[3]),
                   pt.SamplingParams(n=2)):
        with pytest.raises(ValueError, match="pt.LLM"):
            llm.engine.generate(["Hello"], params, chat=False)
    assert llm.engine.num_requests == 0 and not llm.engine.has_unfinished()
