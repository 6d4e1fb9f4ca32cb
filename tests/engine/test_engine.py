"""Engine: continuous batching gives each request exactly the tokens it gets alone; stop rules; limits."""

import pytest
from staggered import run_staggered

from tandem.engine import Engine, EngineConfig, PromptTooLongError, RequestError, SamplingParams
from tandem.model import load_model


@pytest.fixture(scope="module")
def model(tiny_llama_dir):
    return load_model(tiny_llama_dir)


def make_engine(model, **kwargs):
    defaults = dict(max_model_len=128, kv_cache_tokens=128 * 8)
    defaults.update(kwargs)
    return Engine(model, EngineConfig(**defaults))


PROMPTS = [[0, *range(5, 5 + n)] for n in (2, 17, 40, 9, 63, 5)]


def alone(model, prompt, params):
    return make_engine(model).generate([prompt], params)[0].token_ids


def test_staggered_requests_get_exactly_their_solo_greedy_tokens(model):
    params = [SamplingParams.greedy_params(8 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    expected = [alone(model, p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    engine = make_engine(model, max_prefill_tokens=24)  # chunked prefill mixes with decode steps
    assert [o.token_ids for o in run_staggered(engine, PROMPTS, params)] == expected
    assert [len(t) for t in expected] == [8 + 5 * i for i in range(len(PROMPTS))]


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(model):
    params = [
        SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, ignore_eos=True)
        for i in range(4)
    ]
    solo = [alone(model, PROMPTS[i], params[i]) for i in range(4)]
    batched = [o.token_ids for o in make_engine(model).generate(PROMPTS[:4], params)]
    assert solo == batched
    other_seed = SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True)
    assert alone(model, PROMPTS[0], other_seed) != solo[0]


def test_full_kv_budget_makes_requests_wait_in_fcfs_order_without_crashing(model):
    engine = make_engine(model, kv_cache_tokens=128 * 2)  # two slots
    for i in range(5):
        engine.add_request(PROMPTS[i], SamplingParams.greedy_params(4, ignore_eos=True), request_id=str(i))
    finish_order = []
    engine.step()
    assert engine.num_running == 2 and engine.num_waiting == 3
    while engine.has_unfinished():
        finish_order += [int(o.request_id) for o in engine.step() if o.finished]
        assert engine.num_running <= 2
    assert sorted(finish_order) == list(range(5))
    assert finish_order[-1] == 4  # the last arrival is admitted last


def test_prompt_longer_than_context_is_refused_at_admission(model):
    engine = make_engine(model, max_model_len=32, kv_cache_tokens=64)
    with pytest.raises(PromptTooLongError, match="the prompt has 40 tokens; this model's context is 32"):
        engine.add_request(list(range(3, 43)))
    assert not engine.has_unfinished()


def test_bad_prompts_are_refused(model):
    engine = make_engine(model)
    with pytest.raises(RequestError, match="empty"):
        engine.add_request([])
    with pytest.raises(RequestError, match=r"integers in \[0, 320\)"):
        engine.add_request([5, 999])
    engine.add_request([5], request_id="dup")
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request([5], request_id="dup")


def test_output_stops_at_context_length(model):
    engine = make_engine(model, max_model_len=32, kv_cache_tokens=64)
    out = engine.generate([list(range(3, 23))], SamplingParams.greedy_params(100, ignore_eos=True))[0]
    assert len(out.token_ids) == 12 and out.finish_reason == "length"


def test_abort_frees_the_slot_at_once(model):
    engine = make_engine(model, kv_cache_tokens=128)  # one slot
    engine.add_request(PROMPTS[0], SamplingParams.greedy_params(50, ignore_eos=True), request_id="a")
    engine.add_request(PROMPTS[1], SamplingParams.greedy_params(3, ignore_eos=True), request_id="b")
    engine.step()
    assert engine.num_waiting == 1
    assert engine.abort("a")
    assert engine.batcher.num_free_slots == 1
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == ["b"]
    assert not engine.abort("a")


def test_stop_token_ids_and_max_tokens(model):
    engine = make_engine(model)
    free = engine.generate([PROMPTS[2]], SamplingParams.greedy_params(10, ignore_eos=True))[0]
    stop_at = free.token_ids[3]
    out = engine.generate([PROMPTS[2]], SamplingParams.greedy_params(10, stop_token_ids=(stop_at,), ignore_eos=True))
    assert out[0].token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert out[0].finish_reason == "stop" and out[0].stop_reason == stop_at
    assert free.finish_reason == "length"


def test_stop_string_truncates_text_and_is_never_streamed(model):
    engine = make_engine(model)
    params = SamplingParams.greedy_params(30, ignore_eos=True)
    free = engine.generate([PROMPTS[3]], params)[0].text
    stop = free[10:13]
    assert len(stop) == 3
    engine.add_request(PROMPTS[3], SamplingParams.greedy_params(30, stop=(stop,), ignore_eos=True), "s")
    streamed, final = "", None
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert final.text == free[: free.index(stop)] == streamed


def test_streamed_text_deltas_add_up_to_the_final_text(model):
    engine = make_engine(model)
    engine.add_request("def add(a, b):", SamplingParams(max_tokens=40, temperature=1.0, seed=1), "x")
    streamed, final = "", None
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert streamed == final.text == model.tokenizer.decode(final.token_ids)


def test_logprobs_report_top_n_and_the_sampled_token(model):
    engine = make_engine(model)
    out = engine.generate([PROMPTS[0]], SamplingParams.greedy_params(1, logprobs=3))[0]
    (entry,) = out.logprobs
    assert entry.token_id == out.token_ids[0]
    assert len(entry.top) == 3 and entry.token_id in entry.top  # greedy: the sampled token is the top one
    assert max(entry.top.values()) == pytest.approx(entry.logprob)
    assert all(v <= 0 for v in entry.top.values())


def test_engine_counts_tokens(model):
    engine = make_engine(model)
    engine.generate([PROMPTS[0], PROMPTS[1]], SamplingParams.greedy_params(5, ignore_eos=True))
    assert engine.num_prompt_tokens == len(PROMPTS[0]) + len(PROMPTS[1])
    assert engine.num_generated_tokens == 10


# -- prompt logprobs (teacher-forced scoring: echo + logprobs in the completions API) ----------------


def hf_prompt_logprobs(model_dir, ids):
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_prompt_logprobs_equal_log_softmax_of_the_models_own_logits(model, tiny_llama_dir):
    import torch

    ids = PROMPTS[4]  # 64 tokens: three chunks under a 24-token prefill budget
    engine = make_engine(model, max_prefill_tokens=24)
    out = engine.generate([ids], SamplingParams.greedy_params(3, prompt_logprobs=4, ignore_eos=True))[0]
    reference = hf_prompt_logprobs(tiny_llama_dir, ids)
    entries = out.prompt_logprobs
    assert len(entries) == len(ids) and entries[0] is None
    for pos, entry in enumerate(entries[1:], start=1):
        assert entry.token_id == ids[pos]
        assert entry.logprob == pytest.approx(float(reference[pos - 1, ids[pos]]), abs=1e-4)
        top = torch.topk(reference[pos - 1], 4)
        assert list(entry.top) == top.indices.tolist()
        assert list(entry.top.values()) == pytest.approx(top.values.tolist(), abs=1e-4)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(model):
    engine = make_engine(model)
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=0, prompt_logprobs=0), "score")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    (out,) = outs
    assert out.finished and out.finish_reason == "length" and out.token_ids == [] and out.text == ""
    assert len(out.prompt_logprobs) == len(PROMPTS[1]) and out.prompt_logprobs[1].top == {}
    assert engine.num_generated_tokens == 0 and engine.batcher.num_free_slots == engine.batcher.num_slots


def test_prompt_logprobs_are_delivered_once_and_skip_the_prefix_cache(model):
    engine = make_engine(model, prefix_block_size=8)
    plain = SamplingParams.greedy_params(4, ignore_eos=True)
    engine.generate([PROMPTS[4]], plain)  # now the prompt's blocks are cached
    queried = engine.prefix_cache_queries
    scored = SamplingParams.greedy_params(4, prompt_logprobs=1, ignore_eos=True)
    engine.add_request(PROMPTS[4], scored, "scored")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[0].num_cached_tokens == 0 and engine.prefix_cache_queries == queried  # computed in full
    assert len(outs[0].prompt_logprobs) == len(PROMPTS[4]) and all(o.prompt_logprobs is None for o in outs[1:])
    fresh = make_engine(model).generate([PROMPTS[4]], scored)[0]
    assert [e.logprob for e in outs[0].prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in fresh.prompt_logprobs[1:]], abs=1e-5
    )
    # Others still hit: the full blocks before the one holding the last token (7 of 8 tokens each).
    assert engine.generate([PROMPTS[4]], plain)[0].num_cached_tokens == 56
