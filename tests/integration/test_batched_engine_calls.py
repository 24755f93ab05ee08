"""Batched engine calls on the shared engine actor: a forwarder's concurrent requests travel in one Ray call
and come back as each sent alone would; a cancelled request is aborted on the engine while the rest of its
batch goes on."""

from __future__ import annotations

import asyncio

import ray

from operators.engine.client import EngineClient

SEEDED = {"max_tokens": 6, "temperature": 1.0, "seed": 11, "logprobs": 0, "n": 2}
ENDLESS = {"max_tokens": 240, "ignore_eos": True, "temperature": 1.0, "seed": 3, "logprobs": 0}


def counts(engines) -> dict[str, int]:
    return ray.get(engines.handles[0].batch_counts.remote(), timeout=60)


def test_concurrent_requests_share_one_call_and_answer_as_alone(engines):
    prompts = [f"{i}+{i}=" for i in range(12)]
    before = counts(engines)

    async def together() -> list:
        client = EngineClient.named(engines.names[0], restart_timeout=60)
        return await asyncio.gather(*(client.generate(p, SEEDED) for p in prompts))

    batched = asyncio.run(together())
    after = counts(engines)
    # The 12 requests were made in one turn of the loop, so they travelled in one call. Other clients of the
    # shared engine may have sent batches meanwhile, so their count is not asserted, only that one batch of
    # exactly these 12 requests is among the new ones.
    new = after["batches"] - before["batches"]
    assert 1 <= new <= len(after["sizes"]) and len(prompts) in after["sizes"][-new:]
    assert after["calls"] - before["calls"] >= len(prompts)
    alone = [ray.get(engines.handles[0].generate.remote(p, SEEDED), timeout=120) for p in prompts[:3]]
    for one, generation in zip(alone, batched, strict=False):
        assert [s["response_ids"] for s in one["samples"]] == [s.response_ids for s in generation.samples]
        assert generation.prompt_ids == one["prompt_ids"]


def test_a_cancelled_request_is_aborted_on_the_engine_and_its_batch_goes_on(engines):
    async def scenario() -> tuple[list, dict]:
        client = EngineClient.named(engines.names[0], restart_timeout=60)
        endless = asyncio.ensure_future(client.generate("1+1=", ENDLESS))
        short = asyncio.ensure_future(client.generate("2+2=", SEEDED))
        await asyncio.sleep(0.5)  # both are running on the engine, in one batch
        endless.cancel()
        answer = await short
        for _ in range(100):  # the abort reaches the engine within a few polls
            health = await engines.handles[0].health.remote()
            if health["in_flight"] == 0:
                break
            await asyncio.sleep(0.1)
        return [len(s.response_ids) for s in answer.samples], health

    lengths, health = asyncio.run(scenario())
    assert len(lengths) == 2 and all(0 < n <= 6 for n in lengths)
    assert health["in_flight"] == 0  # the 240-token request did not run on
