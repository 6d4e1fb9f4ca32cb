"""Pairs round-trip through JSON (the record every verdict can be re-derived from); the log is bounded."""

import json

from tandem.gate.pairs import Pair, PairLog, Sampling

from .helpers import agreeing, obs, pair, track


def test_a_pair_round_trips_through_json():
    p = agreeing(3, 10, 9, gap_per_token=0.05)
    p = Pair(p.request_id, p.path, p.at, p.sampling, obs(track=track(["a", "b"], offsets=(0, 1))), p.candidate,
             p.agreement, "note")  # fmt: skip
    assert Pair.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_sampling_from_a_client_body():
    s = Sampling.from_body({"temperature": 0, "max_completion_tokens": 5, "stream": True, "top_logprobs": 2})
    assert s.greedy and s.max_tokens == 5 and s.stream and s.logprobs
    assert not Sampling.from_body({}).greedy  # the API's default temperature is 1
    assert Sampling.from_body({"temperature": 0.8, "top_k": 1}).greedy
    assert Sampling.from_body({"temperature": "hot", "seed": True}) == Sampling()


def test_the_log_keeps_the_newest_and_writes_every_pair():
    lines = []
    log = PairLog(limit=2, sink=lines.append)
    for i in range(3):
        log.add(pair(i))
    assert [p.request_id for p in log.snapshot()] == ["r1", "r2"] and log.total == 3 and len(log) == 2
    assert [json.loads(line)["request_id"] for line in lines] == ["r0", "r1", "r2"]
