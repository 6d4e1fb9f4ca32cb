"""Usage details clients read: prompt_tokens_details.cached_tokens from the prefix cache (aiperf), and
stream_options.continuous_usage_stats (usage on every chunk, vLLM's; guidellm always sends it)."""

from __future__ import annotations

import openai
import pytest

from .conftest import MODEL_NAME

PROMPT = "def parse(lines):\n    out = []\n    for line in lines:\n        out.append(line.strip())\n" * 3


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_repeated_prompt_reports_its_cached_tokens(client, tokenizer):
    args = dict(model=MODEL_NAME, prompt=PROMPT + "# first", max_tokens=2, temperature=0)
    client.completions.create(**args)
    again = client.completions.create(**args)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= again.usage.prompt_tokens
    assert cached % 16 == 0  # whole blocks of the prefix cache
    chat = dict(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=2, temperature=0)
    client.chat.completions.create(**chat)
    streamed = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **chat))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_continuous_usage_stats_puts_usage_on_every_chunk(client):
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt="class Point:",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    counted = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counted and counted == sorted(counted) and counted[-1] == 6
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)
    off = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"continuous_usage_stats": False},
        )
    )
    assert all(c.usage is None for c in off)
