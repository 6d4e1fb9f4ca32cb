"""Teacher-forced scoring against servers answering as OpenAI's legacy completions API and vLLM do
(httpx.MockTransport), and the fallback where a server refuses `echo`.

tests/gate/test_cli.py runs the teacher-forced path against real `tandem serve` replicas.
"""

import asyncio
import json

import httpx
import pytest

from tandem.gate.scoring import Kept, Scorer

from .helpers import obs, track

PROMPT, COMPLETION = "def f():", "\n  return 1"
TOKENS = ["def", " f", "():", "\n", "  return", " 1"]


def vllm_echo(tokens, logprobs, top1, text, bos=False):
    """The body vLLM returns for echo=True, logprobs=1, max_tokens=0."""
    if bos:
        tokens, logprobs, top1 = ["<s>", *tokens], [None, *logprobs], [None, *top1]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    top = [None if t is None else {t: lp} for t, lp in zip(top1, logprobs, strict=True)]
    logprobs = [None, *logprobs[1:]]
    return {
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None,
                     "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top,
                                  "text_offset": offsets}}],
        "usage": {"prompt_tokens": len(tokens), "completion_tokens": 0, "total_tokens": len(tokens)},
    }  # fmt: skip


INC = vllm_echo(
    TOKENS, [-2.0, -1.0, -0.5, -0.1, -0.2, -0.3], [None, " f", "():", "\n", "  return", " 1"], PROMPT + COMPLETION
)
CAND = vllm_echo(
    TOKENS, [-2.0, -1.0, -0.5, -0.4, -0.2, -1.3], [None, " f", "():", "\n", "  pass", " 1"], PROMPT + COMPLETION
)


class Servers:
    def __init__(self, inc=INC, cand=CAND, status=200):
        self.answers = {"inc": inc, "cand": cand}
        self.status = status
        self.bodies: list[tuple[str, dict]] = []
        self.fetched: list[str] = []
        self.kept: dict | None = None  # what GET /gate/tracks/{key} answers (None: 404)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # an incumbent's kept track
            self.fetched.append(request.url.path)
            if self.kept is None:
                return httpx.Response(404, json={"error": {"message": "no kept track", "type": "x"}})
            return httpx.Response(200, json=self.kept)
        body = json.loads(request.content)
        self.bodies.append((request.url.host, body))
        status = self.status(request.url.host) if callable(self.status) else self.status
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "echo is not supported", "type": "x"}})
        return httpx.Response(200, json=self.answers[request.url.host])


def score(servers, path="/v1/completions", body=None, scorer=None, inc=None, cand=None, kept=None):
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as client:
            s = scorer or Scorer(client)
            s.client = client
            result = await s.agreement(
                path, body or {"model": "m", "prompt": PROMPT}, inc or obs(text=COMPLETION, track=track(["\n"])),
                cand or obs(text="\n  pass", track=track(["\n"])),
                incumbent_url="http://inc", candidate_url="http://cand", greedy=True, kept=kept,
            )  # fmt: skip
            return result, s

    return asyncio.run(main())


def test_teacher_forced_on_both_sides_with_the_vllm_request_shape():
    servers = Servers()
    (agreement, note), scorer = score(servers)
    assert note is None and agreement.method == "teacher-forced"
    assert (agreement.positions, agreement.agree) == (3, 2)
    assert agreement.gap_sum == pytest.approx(0.3 + 1.0)
    assert scorer.teacher_forced == 1 and scorer.unsupported is None
    hosts = sorted(h for h, _ in servers.bodies)
    assert hosts == ["cand", "inc"]
    for _, body in servers.bodies:
        assert body == {"model": "m", "prompt": PROMPT + COMPLETION, "echo": True, "logprobs": 1, "max_tokens": 0,
                        "temperature": 0}  # fmt: skip


def test_a_bos_the_server_shows_does_not_shift_the_completion():
    bos = [vllm_echo(TOKENS, a["choices"][0]["logprobs"]["token_logprobs"][:1] + [-1.0] * 5,
                     [None, " f", "():", "\n", t, " 1"], PROMPT + COMPLETION, bos=True)
           for a, t in ((INC, "  return"), (CAND, "  pass"))]  # fmt: skip
    (agreement, _), _ = score(Servers(*bos))
    assert (agreement.positions, agreement.agree) == (3, 2)


def test_a_4xx_turns_teacher_forcing_off_for_good_and_falls_back_to_the_shared_prefix():
    servers = Servers(status=lambda host: 400 if host == "cand" else 200)
    inc = obs(text=COMPLETION, track=track(["\n", "  return", " 1"]))
    cand = obs(text="\n  pass", track=track(["\n", "  pass"]))
    (agreement, note), scorer = score(servers, inc=inc, cand=cand)
    assert agreement.method == "shared-prefix" and (agreement.positions, agreement.agree) == (2, 1)
    assert scorer.unsupported == "HTTP 400: echo is not supported"
    assert "teacher forcing is off" in note
    sent = len(servers.bodies)
    (agreement, note), _ = score(servers, scorer=scorer, inc=inc, cand=cand)
    assert len(servers.bodies) == sent  # no more echo requests once a server refused one
    assert agreement.method == "shared-prefix" and note == "teacher forcing is off (the servers reject echo)"


def test_a_server_that_ignores_echo_counts_as_refusing_it():
    plain = {"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
    (agreement, note), scorer = score(Servers(cand=plain))
    assert agreement.method == "shared-prefix" and "ignored echo" in scorer.unsupported


def test_a_5xx_falls_back_for_that_pair_only():
    servers = Servers(status=lambda host: 503 if host == "inc" else 200)
    (agreement, note), scorer = score(servers)
    assert agreement.method == "shared-prefix" and note.startswith("scoring failed: HTTP 503")
    assert scorer.unsupported is None and scorer.failures == 1
    servers.status = 200
    (agreement, _), _ = score(servers, scorer=scorer)
    assert agreement.method == "teacher-forced"


def test_different_tokenizations_are_not_compared():
    other = vllm_echo(["de", "f f", "():", "\n", "  return", " 1"], [-1.0] * 6, [None] * 6, PROMPT + COMPLETION)
    (agreement, note), scorer = score(Servers(cand=other))
    assert agreement.method == "shared-prefix" and scorer.mismatches == 1 and "different tokens" in note


def test_chat_pairs_and_token_prompts_use_the_shared_prefix():
    servers = Servers()
    (agreement, note), _ = score(servers, path="/v1/chat/completions", body={"model": "m", "messages": []})
    assert agreement.method == "shared-prefix" and note == "no single text prompt to echo" and not servers.bodies
    (agreement, note), _ = score(servers, body={"model": "m", "prompt": [1, 2, 3]})
    assert note == "no single text prompt to echo"


def test_no_logprobs_anywhere_means_no_agreement():
    (agreement, note), _ = score(Servers(), path="/v1/chat/completions", body={}, inc=obs(), cand=obs())
    assert agreement is None and "no logprobs" in note


def kept_track(tokens=("\n", "  return", " 1"), logprobs=(-0.1, -0.2, -0.3), text=COMPLETION) -> dict:
    """GET /gate/tracks/{key}: the completion's own logprobs as the incumbent's replica kept them."""
    return {"text": text, "logprobs": {"tokens": list(tokens), "token_logprobs": list(logprobs),
                                       "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
                                       "text_offset": [0, 1, 9]}}  # fmt: skip


def test_the_incumbents_kept_track_spares_it_the_echo_and_scores_the_same():
    servers = Servers()
    servers.kept = kept_track()
    (agreement, note), scorer = score(servers, kept=Kept("http://inc", "key-1"))
    assert [h for h, _ in servers.bodies] == ["cand"]  # the only echo: no scoring prefill on the incumbent
    assert servers.fetched == ["/gate/tracks/key-1"]
    (echoed, _), _ = score(Servers())  # the same pair, echoed on both sides
    assert note is None and agreement == echoed  # 3 positions, 2 agree, gap 0.3 + 1.0
    assert (scorer.kept, scorer.kept_missed, scorer.teacher_forced) == (1, 0, 1)


def test_a_stop_string_cuts_the_text_not_the_tokens_and_a_retokenized_tail_is_left_out():
    # The client got "\n  return" (a stop string cut " 1"); the replica generated three tokens.
    servers = Servers()
    servers.kept = kept_track(text="\n  return")
    inc = obs(text="\n  return", track=None)
    echo = vllm_echo(
        TOKENS[:5], [-2.0, -1.0, -0.5, -0.4, -0.2], [None, " f", "():", "\n", "  pass"], PROMPT + "\n  return"
    )
    servers.answers["cand"] = echo
    (agreement, note), scorer = score(servers, inc=inc, kept=Kept("http://inc", "k"))
    assert note is None and scorer.kept == 1 and (agreement.positions, agreement.agree) == (2, 1)
    # The echo split "  return" in two: the positions up to the split still count.
    servers = Servers()
    servers.kept = kept_track()
    split = [*TOKENS[:4], "  ret", "urn", " 1"]
    servers.answers["cand"] = vllm_echo(split, [-1.0] * 7, [None, *split[1:]], PROMPT + COMPLETION)
    (agreement, note), scorer = score(servers, kept=Kept("http://inc", "k"))
    assert note is None and scorer.kept == 1 and (agreement.positions, agreement.agree) == (1, 1)


@pytest.mark.parametrize(
    "answer",
    [None, kept_track(text="something else"), kept_track(tokens=("\n  ", "ret", "urn 1"))],
    ids=["missing", "another-text", "another-first-token"],
)
def test_a_kept_track_that_is_missing_or_does_not_fit_falls_back_to_the_echo(answer):
    servers = Servers()
    servers.kept = answer
    (agreement, note), scorer = score(servers, kept=Kept("http://inc", "key-1"))
    assert sorted(h for h, _ in servers.bodies) == ["cand", "inc"]
    assert note is None and agreement.method == "teacher-forced" and (agreement.positions, agreement.agree) == (3, 2)
    assert (scorer.kept, scorer.kept_missed) == (0, 1)
