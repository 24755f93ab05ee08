"""Partial rollout on the real in-process engine: a swap cuts the generations in flight, and each goes on
under the new weights from its prompt plus what it had, every token stamped with the version that sampled it.

The swaps reload the engine's own weights under a new version number (a real reload through the worker
extension), and every test puts the engine back on the version it found.
"""

from __future__ import annotations

import asyncio

import pytest

from schemas.config import DEFAULT_MODEL
from schemas.errors import StaleRequest

TOKENS = 120
SAMPLING = {"n": 2, "temperature": 1.0, "max_tokens": TOKENS, "ignore_eos": True, "seed": 7}


def sampled_so_far(engine) -> int:
    """The fewest tokens any request in flight has sampled, read from vLLM's output processor: the engine's
    requests report nothing until they end, and a test must cut one mid-way."""
    states = engine.llm.output_processor.request_states.values()
    return min((len(s.detokenizer.output_token_ids) for s in states), default=0)


async def mid_way(engine, sampling: dict, at_least: int = 4) -> asyncio.Future:
    """A generation started and waited on until each of its samples has `at_least` tokens."""
    request = asyncio.ensure_future(engine.generate("Count to one hundred:", sampling))
    while not engine.dispatched or sampled_so_far(engine) < at_least:
        assert not request.done(), "the generation ended before it could be cut"
        await asyncio.sleep(0.002)
    return request


async def swap(engine, version: int, preempt: bool = True) -> dict:
    return await engine.load_checkpoint(str(DEFAULT_MODEL), version, None, preempt)


@pytest.fixture
def same_version(loop, engine):
    """The session engine's version, restored after the test."""
    version = engine.model_version
    yield version
    if engine.model_version != version:
        loop.run_until_complete(swap(engine, version, preempt=False))


def test_a_swap_cuts_each_sample_which_goes_on_under_the_new_version(loop, engine, same_version):
    v = same_version
    preempted = engine.counters()["preempted"]

    async def scenario() -> tuple[dict, dict]:
        request = await mid_way(engine, SAMPLING)
        report = await swap(engine, v + 1)
        return report, await request

    report, generation = loop.run_until_complete(scenario())
    assert report["preempted"] == 1 and engine.counters()["preempted"] == preempted + 1
    assert generation["model_version"] == v  # the oldest token's version: staleness is judged on it
    for sample in generation["samples"]:
        ids, versions = sample["response_ids"], sample["token_versions"]
        assert len(ids) == len(sample["logprobs"]) == len(versions) == TOKENS  # the whole budget, once
        assert sample["finish_reason"] == "length"
        assert versions[0] == v and versions[-1] == v + 1 and versions == sorted(versions)
        assert versions.count(v) >= 4  # what it had sampled before the cut is kept
        assert all(lp <= 0.0 for lp in sample["logprobs"])
        assert sample["text"] == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert not engine.dispatched and not engine.preempted and engine.in_flight == 0


def test_without_partial_rollout_a_swap_waits_and_the_generation_keeps_one_version(
    loop, engine, same_version
):
    v = same_version

    async def scenario() -> tuple[dict, dict]:
        request = await mid_way(engine, {**SAMPLING, "n": 1})
        report = await swap(engine, v + 1, preempt=False)
        return report, await request

    report, generation = loop.run_until_complete(scenario())
    assert report["preempted"] == 0
    assert generation["model_version"] == v
    (sample,) = generation["samples"]
    assert sample["token_versions"] is None and len(sample["response_ids"]) == TOKENS  # all at v


def test_after_a_failed_load_the_cut_samples_go_on_with_the_old_version(
    loop, engine, same_version, monkeypatch
):
    v = same_version

    async def failing_load(*args, **kwargs):
        """Test double: a weight load failing inside the swap (a fault real parts cannot show on demand)."""
        raise RuntimeError("load failed (test double)")

    async def scenario() -> dict:
        request = await mid_way(engine, {**SAMPLING, "n": 1})
        with monkeypatch.context() as patch:
            patch.setattr(engine.llm, "collective_rpc", failing_load)
            with pytest.raises(RuntimeError, match="test double"):
                await swap(engine, v + 1)
        return await request

    generation = loop.run_until_complete(scenario())
    assert engine.model_version == v  # the version did not move
    (sample,) = generation["samples"]
    assert sample["token_versions"] == [v] * TOKENS and sample["finish_reason"] == "length"


def test_a_continuation_is_aborted_as_stale_by_its_oldest_token(loop, engine, same_version):
    v = same_version
    wasted = engine.counters()["wasted_tokens"]

    async def scenario() -> int:
        request = await mid_way(engine, {**SAMPLING, "n": 1})
        await swap(engine, v + 1)
        while (
            v not in engine.dispatched.values()
        ):  # the continuation, stamped with its oldest token's version
            assert not request.done()
            await asyncio.sleep(0.001)
        aborted = await engine.abort_older_than(v + 1)
        with pytest.raises(StaleRequest, match=f"version {v},"):
            await request
        return aborted

    assert loop.run_until_complete(scenario()) == 1
    assert engine.counters()["wasted_tokens"] >= wasted + 4  # the cut part counts as waste too
    assert not engine.dispatched and not engine.hopeless and not engine.preempted
