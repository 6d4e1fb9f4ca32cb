"""Requests that cost far more than their size, against a real replica (16 KV slots + a queue of 64,
so one request may hold max_request_share 0.25 x 80 = 20 sequences):

- stop_token_ids of 400,000 entries with n=16 and min_tokens=200: a 400 naming the field, at once
  (it used to run for minutes and double the replica's memory);
- bad_words of 256 strings of 3,900 characters with n=16: a 400 naming the field (it blocked the
  engine thread 8 s); 256 words within the bounds, n=16: served while a neighbour stays quick;
- 1,024 logit_bias entries, or logprobs 20, n=16, four requests at once: a neighbour that arrives
  behind them is served before they finish (it used to queue 20 s);
- 20 prompts x n=16 = 320 sequences: a 400 naming the bound, never a 429 for the neighbours; two
  requests within the bound do not make a later neighbour wait for all their sequences (it waits
  at most for the slots a request already held to free: there is no preemption);
- ten concurrent POST /tokenize of 960 KB: 400s naming the limit, the replica's memory flat.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from flood import HealthWatch
from server_process import ServerProcess

from tandem.engine.processor_tables import MAX_BAD_WORD_TOKENS
from tandem.serve.bounds import MAX_LOGIT_BIAS, max_prompt_chars

from .conftest import CONTEXT, MODEL_NAME, server_args

NEIGHBOUR = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def roomy(serve_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("roomy")
    args = server_args(Path(serve_model_dir), "--max-num-seqs", "16", "--max-queue", "64")
    process = ServerProcess(args, root / "roomy.log")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def post(url: str, body: dict, timeout: float = 120) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    return response, time.monotonic() - started


def baseline_seconds(url: str) -> float:
    times = []
    for _ in range(3):
        response, seconds = post(url, NEIGHBOUR)
        assert response.status_code == 200
        times.append(seconds)
    return statistics.median(times)


def wait_for_load(url: str, running: int, waiting: int, timeout: float = 60) -> None:
    """Until GET /load reports these sequences running and waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = httpx.get(url + "/load", timeout=10).json()
        if (load["running"], load["waiting"]) == (running, waiting):
            return
        time.sleep(0.02)
    raise AssertionError(f"the replica never reported {running} running and {waiting} waiting: {load}")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_400k_stop_token_ids_with_n_16_and_min_tokens_200_is_a_400_naming_the_field(roomy):
    body = {**NEIGHBOUR, "stop_token_ids": [7] * 400_000, "n": 16, "min_tokens": 200, "max_tokens": 256}
    response, seconds = post(roomy.url, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "stop_token_ids" and "at most" in error["message"] and "vocabulary" in error["message"]
    assert seconds < 10
    assert post(roomy.url, NEIGHBOUR)[0].status_code == 200


def test_256_bad_words_of_3900_characters_with_n_16_is_a_400_naming_the_field(roomy):
    body = {**NEIGHBOUR, "bad_words": [f"w{i} " + "x" * 3895 for i in range(256)], "n": 16}
    response, _ = post(roomy.url, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith("bad_words") and "at most 512 characters" in error["message"]


def test_256_bad_words_within_the_bounds_with_n_12_leave_a_neighbour_quick(roomy, tokenizer):
    words = [f"zq{i} " + "ab cd " * 8 for i in range(256)]
    assert max(len(tokenizer.encode(w, add_special_tokens=False)) for w in words) <= MAX_BAD_WORD_TOKENS
    idle = baseline_seconds(roomy.url)
    body = {**NEIGHBOUR, "bad_words": words, "n": 12, "max_tokens": 48, "temperature": 1.0, "seed": 1}
    results: list[httpx.Response] = []
    heavy = threading.Thread(target=lambda: results.append(post(roomy.url, body)[0]))
    with HealthWatch(roomy.url) as watch:
        heavy.start()
        time.sleep(0.5)
        neighbours = [post(roomy.url, NEIGHBOUR) for _ in range(3)]
        heavy.join(120)
    assert results and results[0].status_code == 200, results
    assert all(r.status_code == 200 for r, _ in neighbours)
    worst = max(s for _, s in neighbours)
    assert worst < max(1.0, 4 * idle) + 1.0, (worst, idle)  # the engine thread was never blocked for long
    assert watch.worst < 1.0


@pytest.mark.parametrize("costly", ["logit_bias", "logprobs"])
def test_four_costly_n_16_requests_at_once_do_not_queue_a_neighbour_behind_all_of_them(roomy, serve_model_dir, costly):
    # A bias on every token of this model's vocabulary (the most it allows; MAX_LOGIT_BIAS is 1,024).
    vocab = json.loads((Path(serve_model_dir) / "config.json").read_text())["vocab_size"]
    extra = {"logit_bias": {str(i): 0.5 for i in range(min(vocab, MAX_LOGIT_BIAS))}} if costly == "logit_bias" else {}
    extra = extra or {"logprobs": 20}
    body = {**NEIGHBOUR, **extra, "n": 16, "max_tokens": 200, "temperature": 1.0}
    done: dict[str, float] = {}
    statuses: list[int] = []

    def send(name: str, payload: dict) -> None:
        response, _ = post(roomy.url, payload)
        statuses.append(response.status_code)
        done[name] = time.monotonic()

    with ThreadPoolExecutor(5) as pool:
        for i in range(4):
            pool.submit(send, f"costly-{i}", body)
        wait_for_load(roomy.url, running=16, waiting=48)  # all four admitted
        pool.submit(send, "neighbour", NEIGHBOUR)
    assert statuses == [200] * 5, statuses
    # The neighbour took one of the first slots that freed, not the place behind 48 queued sequences:
    # at most the request holding the slots when it came finished before it.
    assert sum(t < done["neighbour"] for name, t in done.items() if name != "neighbour") <= 1, done


def test_320_sequences_are_a_400_naming_the_bound_and_neighbours_get_no_429(roomy):
    flood = {**NEIGHBOUR, "prompt": ["def f():"] * 20, "n": 16, "max_tokens": 64}
    statuses: list[int] = []
    messages: list[str] = []
    stop = threading.Event()

    def neighbour() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            statuses.append(post(roomy.url, NEIGHBOUR)[0].status_code)

    watcher = threading.Thread(target=neighbour)
    watcher.start()
    try:
        for _ in range(5):
            response, _ = post(roomy.url, flood)
            assert response.status_code == 400, response.text
            messages.append(response.json()["error"]["message"])
            assert response.json()["error"]["param"] == "n"
    finally:
        stop.set()
        watcher.join(90)
    assert "needs 320 sequences" in messages[0] and "at most 20" in messages[0] and "max_request_share" in messages[0]
    assert statuses and set(statuses) == {200}, statuses


def test_requests_within_the_bound_let_a_later_neighbour_in_before_they_finish(roomy):
    big = {**NEIGHBOUR, "prompt": ["def f():"] * 5, "n": 4, "max_tokens": 300}  # 20 sequences each
    done: dict[str, float] = {}
    statuses: list[int] = []

    def send(name: str, payload: dict) -> None:
        response, _ = post(roomy.url, payload)
        statuses.append(response.status_code)
        done[name] = time.monotonic()

    with ThreadPoolExecutor(3) as pool:
        pool.submit(send, "first", big)
        wait_for_load(roomy.url, running=16, waiting=4)
        pool.submit(send, "second", big)
        wait_for_load(roomy.url, running=16, waiting=24)
        pool.submit(send, "neighbour", NEIGHBOUR)
    assert statuses == [200] * 3, statuses
    # The first took all 16 slots (nobody else waited); when they freed, the neighbour got one ahead of the
    # first's last 4 and the second's 20 sequences (arrival order alone would have put it after all of them).
    assert done["neighbour"] < done["first"] < done["second"], done


def test_ten_concurrent_960_kb_tokenize_calls_are_refused_before_tokenizing(roomy):
    text = "x = 1 " * (960_000 // 6)  # 960 KB, within the 1 MiB body limit
    before = peak_rss_mb(roomy.proc.pid)

    def tokenize(_: int) -> httpx.Response:
        return httpx.post(roomy.url + "/tokenize", json={"prompt": text}, timeout=60)

    with HealthWatch(roomy.url) as watch, ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(tokenize, range(10)))
    assert [r.status_code for r in responses] == [400] * 10
    error = responses[0].json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert str(max_prompt_chars(CONTEXT)) in error["message"]
    assert peak_rss_mb(roomy.proc.pid) - before < 200  # it was 1.7 GB
    assert watch.worst < 1.0
