"""Kept tracks (tandem.serve.kept_tracks): the incumbent's own logprobs for the gate, against a real
replica of a fleet (it has the fleet's secret, as a gateway's replicas do).

A request marked with KEEP_TRACK_HEADER gets the very answer it would get unmarked (no logprobs
unless it asked); its track, the same logprobs a client asking logprobs=1 would have been sent,
is fetched once from KEPT_TRACK_PATH. A lone replica (no fleet secret) keeps nothing, whoever
asks. (tests/gateway/test_gate_live.py scores with it against a candidate's echo, on real replicas.)
"""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import SecretStr

from tandem.edge.keep_track import KEEP_TRACK_HEADER, KEPT_TRACK_HEADER, KEPT_TRACK_PATH
from tandem.serve.kept_tracks import KeptTracks, keep_key

from .conftest import API_KEY, FLEET_SECRET, MODEL_NAME

BODY = {"model": MODEL_NAME, "prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def http(fleet_server):
    with httpx.Client(
        base_url=fleet_server.url, timeout=60, headers={"Authorization": f"Bearer {FLEET_SECRET}"}
    ) as client:
        yield client


def _stream_text(response: httpx.Response) -> tuple[str, list[dict]]:
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(e["choices"][0]["text"] for e in events if e["choices"]), events


@pytest.mark.parametrize("stream", [False, True])
def test_a_marked_request_gets_the_same_answer_and_its_track_is_kept_once(http, stream):
    plain = http.post("/v1/completions", json={**BODY, "stream": stream})
    marked = http.post("/v1/completions", json={**BODY, "stream": stream}, headers={KEEP_TRACK_HEADER: "k-" + "a" * 16})
    assert plain.status_code == marked.status_code == 200
    if stream:
        (text, events), (plain_text, _) = _stream_text(marked), _stream_text(plain)
        assert text == plain_text and all(c["logprobs"] is None for e in events for c in e["choices"])
    else:
        choice = marked.json()["choices"][0]
        text = choice["text"]
        assert text == plain.json()["choices"][0]["text"] and choice["logprobs"] is None  # nothing sent
    kept = http.get(f"{KEPT_TRACK_PATH}/k-{'a' * 16}")
    assert kept.status_code == 200
    track = kept.json()
    assert track["text"] == text
    asked = http.post("/v1/completions", json={**BODY, "logprobs": 1}).json()["choices"][0]["logprobs"]
    assert track["logprobs"]["tokens"] == asked["tokens"] and "".join(asked["tokens"]) == text
    assert track["logprobs"]["token_logprobs"] == pytest.approx(asked["token_logprobs"], abs=1e-4)
    gone = http.get(f"{KEPT_TRACK_PATH}/k-{'a' * 16}")
    assert gone.status_code == 404 and "never kept, already fetched" in gone.json()["error"]["message"]


def test_a_sampled_answer_is_the_same_with_its_track_kept(http):
    sampled = {**BODY, "temperature": 0.9, "top_p": 0.95, "seed": 3, "max_tokens": 24}
    plain = http.post("/v1/completions", json=sampled).json()["choices"][0]["text"]
    marked = http.post("/v1/completions", json=sampled, headers={KEEP_TRACK_HEADER: "sampled-key"})
    assert marked.json()["choices"][0]["text"] == plain
    assert http.get(f"{KEPT_TRACK_PATH}/sampled-key").json()["text"] == plain


def test_requests_the_gate_does_not_score_this_way_keep_nothing(http):
    for extra in ({"n": 2}, {"logprobs": 2}, {"echo": True}):
        key = "x" * 10 + str(len(extra)) + next(iter(extra))
        assert http.post("/v1/completions", json={**BODY, **extra}, headers={KEEP_TRACK_HEADER: key}).status_code == 200
        assert http.get(f"{KEPT_TRACK_PATH}/{key}").status_code == 404
    http.post("/v1/completions", json=BODY, headers={KEEP_TRACK_HEADER: "short"})  # malformed key: ignored
    assert http.get(f"{KEPT_TRACK_PATH}/short").status_code == 404


def test_kept_tracks_are_behind_the_api_key(guarded_server):
    with httpx.Client(base_url=guarded_server.url, timeout=60) as client:
        assert client.get(f"{KEPT_TRACK_PATH}/{'b' * 16}").status_code == 401
        authorized = client.get(f"{KEPT_TRACK_PATH}/{'b' * 16}", headers={"Authorization": f"Bearer {API_KEY}"})
        assert authorized.status_code == 404


def test_the_store_is_bounded_and_hands_each_track_out_once():
    tracks = KeptTracks(capacity=2)
    for key in ("k1", "k2", "k3"):
        tracks.keep(key, key, {"tokens": [key]})
    assert len(tracks) == 2 and tracks.evicted == 1 and tracks.pop("k1") is None
    assert tracks.pop("k3") == {"text": "k3", "logprobs": {"tokens": ["k3"]}} and tracks.pop("k3") is None


def test_only_the_fleets_secret_makes_a_replica_keep_a_track():
    secret, auth = SecretStr(FLEET_SECRET), {"authorization": f"Bearer {FLEET_SECRET}"}
    assert keep_key({KEEP_TRACK_HEADER: "abcdefgh", **auth}, secret) == "abcdefgh"
    assert keep_key({KEEP_TRACK_HEADER: "../etc/passwd", **auth}, secret) is None and keep_key(auth, secret) is None
    assert keep_key({KEEP_TRACK_HEADER: "abcdefgh"}, secret) is None  # no secret sent
    assert keep_key({KEEP_TRACK_HEADER: "abcdefgh", "authorization": "Bearer guess"}, secret) is None
    assert keep_key({KEEP_TRACK_HEADER: "abcdefgh", **auth}, None) is None  # a lone replica keeps nothing


def test_a_lone_replica_ignores_the_keep_track_header(server):
    key = "lone-" + "c" * 12
    with httpx.Client(base_url=server.url, timeout=60) as client:
        marked = client.post("/v1/completions", json=BODY, headers={KEEP_TRACK_HEADER: key})
        assert marked.status_code == 200 and marked.json()["choices"][0]["logprobs"] is None
        assert client.get(f"{KEPT_TRACK_PATH}/{key}").status_code == 404


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_says_whether_its_track_is_kept(http, stream):
    """The gateway never guesses (tandem.edge.keep_track): KEPT_TRACK_HEADER on what was kept, only there."""
    kept = http.post("/v1/completions", json={**BODY, "stream": stream}, headers={KEEP_TRACK_HEADER: "said-" + "k" * 8})
    assert kept.headers.get(KEPT_TRACK_HEADER) == "1"
    assert http.get(f"{KEPT_TRACK_PATH}/said-{'k' * 8}").status_code == 200
    unmarked = http.post("/v1/completions", json={**BODY, "stream": stream})
    not_kept = http.post(
        "/v1/completions", json={**BODY, "stream": stream, "n": 2}, headers={KEEP_TRACK_HEADER: "said-" + "n" * 8}
    )
    assert KEPT_TRACK_HEADER not in unmarked.headers and KEPT_TRACK_HEADER not in not_kept.headers
