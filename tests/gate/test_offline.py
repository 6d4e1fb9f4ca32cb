"""The offline gate's parts without processes: the workload, the pair driver on MockTransport,
starting replicas (fake backends)."""

import asyncio
import json
import uuid
from dataclasses import replace

import httpx
import pytest
from completion_events import completion_chunk, sse, usage_chunk

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.fake import FakeBackend
from tandem.cluster.local import LocalBackend
from tandem.data.bundled import bundled_model_dir
from tandem.gate.offline import GateRunError, OfflineRun, run_pairs, start_replicas, workload_bodies
from tandem.workload import load_workload


def test_the_workload_is_the_benchs_as_text_bodies():
    run = OfflineRun("baseline", "int8", requests=12, seed=3)
    bodies = workload_bodies(run, "tandem-code-target")
    assert bodies == workload_bodies(run, "tandem-code-target")  # the same draw every time
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    lengths = [(len(r.prompt_ids), r.max_tokens) for r in load_workload(_Enc(tok), 512 - 8, 12, seed=3)]
    for body, (prompt_len, max_tokens) in zip(bodies, lengths, strict=True):
        assert body["max_tokens"] == max_tokens and body["temperature"] == 0.0 and "seed" not in body
        assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["logprobs"] == 1
        assert body["ignore_eos"] and isinstance(body["prompt"], str)
        assert abs(len(tok.encode(body["prompt"], add_special_tokens=False).ids) - prompt_len) <= 4
        assert prompt_len + max_tokens <= 512 - 8
    sampled = workload_bodies(replace(run, temperature=0.8), "m")
    assert len({b["seed"] for b in sampled}) == 12


class _Enc:
    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids


def test_a_model_without_a_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(GateRunError, match="tokenizer.json: cannot load the tokenizer"):
        workload_bodies(OfflineRun("a", "b", model=str(tmp_path)), "m")


def test_run_pairs_mirrors_every_request_then_scores_after_the_last():
    log: list[tuple[str, dict]] = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        log.append((request.url.host, body))
        if body.get("echo"):
            return httpx.Response(400, json={"error": {"message": "echo is not supported"}})
        chunks = [completion_chunk(t, tokens=[t]) for t in "ab"]
        return httpx.Response(200, content=sse(*chunks, usage_chunk(2), "[DONE]"))

    bodies = [{"model": "m", "prompt": f"p{i}", "max_tokens": 2, "temperature": 0.0, "stream": True, "logprobs": 1}
              for i in range(6)]  # fmt: skip

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
            return await run_pairs(bodies, client, "http://inc", "http://cand", concurrency=2, warmup=1)

    result = asyncio.run(main())
    assert [p.request_id for p in result.pairs] == [str(uuid.UUID(int=i)) for i in range(6)]
    assert all(p.comparable and p.agreement.method == "shared-prefix" for p in result.pairs)
    assert result.teacher_forcing_off == "HTTP 400: echo is not supported"
    generation = [(h, b) for h, b in log if not b.get("echo")]
    assert len(generation) == 2 + 12  # a warm-up request each, then every body on both sides
    assert [b["max_tokens"] for _, b in generation[:2]] == [4, 4]
    echo = [b for _, b in log if b.get("echo")]
    assert len(echo) == 2  # the first pair's scoring found echo refused; no other pair tried
    last_generation = max(i for i, (_, b) in enumerate(log) if not b.get("echo"))
    assert min(i for i, (_, b) in enumerate(log) if b.get("echo")) > last_generation  # scored after the last
    assert result.mirror["mirrored"] == 6 and result.mirror["paired"] == 6


def test_start_replicas_waits_for_ready():
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    backend = FakeBackend(lambda: clock[0], startup_s=2.0)
    specs = [ReplicaSpec("incumbent", "baseline"), ReplicaSpec("candidate", "int8")]
    ready = start_replicas(backend, specs, timeout_s=10, clock=lambda: clock[0], sleep=sleep)
    assert [r.spec.recipe for r in ready] == ["baseline", "int8"] and clock[0] >= 2.0
    slow = FakeBackend(lambda: clock[0], startup_s=100.0)
    with pytest.raises(GateRunError, match="were not ready within 10 s"):
        start_replicas(slow, specs, timeout_s=10, clock=lambda: clock[0], sleep=sleep)


def test_a_replica_that_dies_while_starting_is_reported_with_its_log(tmp_path):
    class Dead:
        pid = 1

        def poll(self):
            return 1

        def terminate(self):
            pass

        def kill(self):
            pass

        def output_tail(self):
            return "loading\nRecipeError: unknown optimizer 'nope'\n"

    def spawn(argv, env, replica_id):
        (tmp_path / f"{replica_id}.log").write_text("loading\nRecipeError: unknown optimizer 'nope'\n")
        return Dead()

    backend = LocalBackend(spawn=spawn, ports=lambda taken: 1, probe=lambda url: False)
    with pytest.raises(GateRunError, match=r"the nope replica exited \(code 1\).*unknown optimizer 'nope'"):
        start_replicas(backend, [ReplicaSpec("candidate", "nope")], timeout_s=10, sleep=lambda s: None)
