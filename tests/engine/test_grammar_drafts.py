"""Forced tokens as drafts (tandem.engine.grammar_drafts): on the bundled model the greedy output is
the same as one token a step, in fewer steps; a sampled draft's q gets a point mass per forced token;
the room left in the slot and in max_tokens bounds them."""

from __future__ import annotations

import json

import jsonschema
import torch

from tandem.engine import Engine, EngineConfig, GrammarSpec, SamplingParams
from tandem.engine.grammar_drafts import with_forced_tokens
from tandem.engine.speculation import Proposal
from tandem.model import load_model

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "minimum": 0}},
    "required": ["name", "count"],
}
JSON = GrammarSpec("json", json.dumps(SCHEMA))


class _Forcing:
    """A grammar that forces [7, 8, 9] after whatever was drafted."""

    finished = False

    def __init__(self) -> None:
        self.asked: list[tuple[list[int], int]] = []

    def forced_after(self, token_ids: list[int], limit: int) -> list[int]:
        self.asked.append((token_ids, limit))
        return [7, 8, 9][:limit]


class _Seq:
    def __init__(self, grammar) -> None:
        self.grammar = grammar


def test_forced_tokens_follow_the_proposal_within_the_room_and_extend_a_sampled_q():
    plain, forcing, sampled = _Seq(None), _Seq(_Forcing()), _Seq(_Forcing())
    q = torch.full((1, 10), 0.1)
    proposals = [Proposal([1]), None, Proposal([2], q)]
    out, added = with_forced_tokens([plain, forcing, sampled], proposals, room=[5, 2, 5])
    assert out[0].tokens == [1]  # no grammar: untouched
    assert out[1].tokens == [7, 8] and forcing.grammar.asked == [([], 2)]  # two tokens of room
    assert out[2].tokens == [2, 7, 8, 9] and added == 5
    assert out[2].probs.shape == (4, 10) and torch.equal(out[2].probs[0], q[0])
    assert out[2].probs[1:].argmax(-1).tolist() == [7, 8, 9] and out[2].probs[1:].sum().item() == 3.0


def test_forced_drafts_keep_the_greedy_output_in_fewer_steps():
    engine = Engine(load_model(), EngineConfig(max_num_seqs=4, num_threads=1))
    prompts = ["def main():\n", "x = ["]
    params = SamplingParams.greedy_params(80, grammar=JSON)

    def generate() -> tuple[list[list[int]], int]:
        steps = [0]
        step = engine.step

        def counted():
            steps[0] += 1
            return step()

        engine.step = counted
        try:
            return [o.token_ids for o in engine.generate(prompts, [params] * len(prompts))], steps[0]
        finally:
            del engine.step

    engine.forced_drafts = False
    one_a_step, plain_steps = generate()
    engine.forced_drafts = True
    forced, forced_steps = generate()
    assert forced == one_a_step
    assert engine.num_forced_tokens > 0 and forced_steps < plain_steps
    text = engine.model.tokenizer.decode(forced[0])
    jsonschema.validate(json.loads(text), SCHEMA)
