"""AsyncEngine: streaming async iterators over a background step loop; cancelling aborts."""

import asyncio

import pytest

from tandem.engine import AsyncEngine, Engine, EngineConfig, PromptTooLongError, SamplingParams
from tandem.model import load_model


@pytest.fixture(scope="module")
def model(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture
def async_engine(model):
    engine = AsyncEngine(Engine(model, EngineConfig(max_model_len=128, kv_cache_tokens=128 * 4)))
    yield engine
    engine.shutdown()


def test_concurrent_streams_match_the_synchronous_engine(model, async_engine):
    prompts = [[0, *range(5, 5 + n)] for n in (3, 20, 50)]
    params = SamplingParams.greedy_params(12, ignore_eos=True)
    sync = Engine(model, EngineConfig(max_model_len=128, kv_cache_tokens=128 * 4))
    expected = [o.token_ids for o in sync.generate(prompts, params)]

    async def collect(prompt):
        tokens = []
        async for out in async_engine.generate(prompt, params):
            tokens += out.new_token_ids
        return tokens

    async def main():
        return await asyncio.gather(*(collect(p) for p in prompts))

    assert asyncio.run(main()) == expected


def test_cancelling_a_stream_aborts_and_frees_the_slot(async_engine):
    async def main():
        params = SamplingParams.greedy_params(100, ignore_eos=True)
        seen = 0
        async for _ in async_engine.generate([0, 5, 6], params, request_id="gone"):
            seen += 1
            if seen == 3:
                break  # the client went away
        for _ in range(200):
            if async_engine.engine.batcher.num_free_slots == 4:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_bad_prompt_raises_in_the_caller(async_engine):
    async def main():
        async for _ in async_engine.generate(list(range(3, 200)), SamplingParams()):
            pass

    with pytest.raises(PromptTooLongError):
        asyncio.run(main())
