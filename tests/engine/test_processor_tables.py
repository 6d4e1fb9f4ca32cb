"""ProcessorTables: a request's bad words, biases, stop ids and EOS precomputed once; what a step bans
and biases from them; the bounds the engine itself enforces."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import Engine, EngineConfig, RequestError, SamplingParams
from tandem.engine.outputs import RequestMetrics
from tandem.engine.processor_tables import MAX_BAD_WORD_TOKENS, ProcessorTables
from tandem.engine.processors import LogitsRow, process_logits
from tandem.engine.sequence import Sequence
from tandem.model import load_model

EOS = 1


def test_bans_follow_the_output_through_the_precomputed_tables():
    params = SamplingParams(max_tokens=20, min_tokens=3, stop_token_ids=(4, 6, 4), bad_words=("x",))
    tables = ProcessorTables.build(params, {EOS}, [[17], [31, 14], [9, 31, 8], [9, 31, 12], [20, 2]])

    def banned(output):
        seq = Sequence("s", [0], params, None, frozenset({EOS}), 100, RequestMetrics(0.0))
        seq.output_ids, seq.tables = list(output), tables
        out = process_logits(torch.zeros(1, 40), [LogitsRow(seq)])
        return torch.isinf(out[0]).nonzero()[:, 0].tolist()

    assert banned([5]) == [EOS, 4, 6, 17]  # before min_tokens: EOS and the stop ids (once each)
    assert banned([5, 5, 5, 9, 31]) == [8, 12, 14, 17]  # [9, 31] begins two words, [31] one
    assert banned([5, 5, 5, 20]) == [2, 17]
    assert params.stop_token_ids == (4, 6)  # deduplicated


def test_ids_beyond_a_smaller_vocabulary_are_dropped():
    # A draft model's vocabulary may be smaller than the target's the tables were built for.
    params = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=(3, 45), logit_bias={2: 5.0, 47: 1.0})
    seq = Sequence("s", [0], params, None, frozenset({EOS}), 100, RequestMetrics(0.0))
    logits = torch.zeros(1, 40)
    out = process_logits(logits, [LogitsRow(seq)])
    assert out[0, 2] == 5.0 and torch.isinf(out[0, [EOS, 3]]).all()
    assert int(torch.isinf(out).sum()) == 2


def test_the_engine_refuses_stop_ids_outside_its_vocabulary_and_overlong_bad_words(tiny_llama_dir):
    engine = Engine(load_model(tiny_llama_dir), EngineConfig(max_model_len=64, kv_cache_tokens=256))
    vocab = engine.model.config.vocab_size
    with pytest.raises(RequestError, match="stop_token_ids"):
        engine.add_request([0, 5], SamplingParams(stop_token_ids=(vocab,)))
    long_word = " ".join(f"w{i}" for i in range(MAX_BAD_WORD_TOKENS))
    with pytest.raises(RequestError, match=rf"bad_words\[0\].*at most {MAX_BAD_WORD_TOKENS} tokens"):
        engine.processor_tables(SamplingParams(bad_words=(long_word,)))
    assert not engine.has_unfinished()


def test_choices_sharing_one_table_generate_as_if_each_built_its_own(tiny_llama_dir):
    engine = Engine(load_model(tiny_llama_dir), EngineConfig(max_model_len=64, kv_cache_tokens=512))
    params = SamplingParams.greedy_params(max_tokens=10, min_tokens=6, bad_words=("(self",), logit_bias={7: 3.0})
    alone = engine.generate([[0, 5, 6, 7]], params)[0].token_ids
    shared = engine.processor_tables(params)
    ids = [engine.add_request([0, 5, 6, 7], params, group="req", tables=shared) for _ in range(3)]
    done = {}
    while len(done) < len(ids):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert all(done[i] == alone for i in ids)
