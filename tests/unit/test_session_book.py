"""Sessions and their recording, without an engine: the session book's keys, limits and collection, and how
`RecordingLLM` prepares a request and records vLLM's outputs (real `SamplingParams`; the outputs are plain
objects shaped as vLLM's `RequestOutput`). tests/engine/test_sessions.py runs them on a real engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from operators.engine.recording_llm import Recording, prepared, take
from operators.engine.sessions import SessionBook, SessionLimits, SessionRefused

LIMITS = SessionLimits(max_turns=3, budget=20, call_timeout=30.0, seed=5, run_key=("task", 0))


def output(prompt: list[int], ids: list[int], lps: list[float], finish: str | None) -> SimpleNamespace:
    logprobs = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps, strict=True)]
    choice = SimpleNamespace(index=0, token_ids=ids, logprobs=logprobs, finish_reason=finish)
    return SimpleNamespace(prompt_token_ids=prompt, outputs=[choice])


def test_keys_are_random_and_a_collected_session_is_gone():
    book = SessionBook()
    first, second = book.open(LIMITS), book.open(LIMITS)
    assert first != second and first.startswith("rft-") and len(first) > 30
    book.get(first).add_call("/v1/chat/completions").prompt_ids = [1]
    assert [c["prompt_ids"] for c in book.collect(first)["calls"]] == [[1]]
    with pytest.raises(SessionRefused) as refused:
        book.get(first)
    assert refused.value.status == 401
    with pytest.raises(KeyError, match="collected"):
        book.collect(first)
    book.close(second)
    assert len(book) == 0


def test_each_call_gets_a_seed_from_the_run_and_the_limits_stop_the_session():
    book = SessionBook()
    session = book.get(book.open(LIMITS))
    seeds = []
    for _ in range(3):
        call, seed = session.admit("/v1/responses")
        call.prompt_ids, call.response_ids = [1, 2], [3]
        seeds.append(seed)
    assert len(set(seeds)) == 3 and all(s is not None for s in seeds)
    with pytest.raises(SessionRefused, match="max_turns=3") as refused:
        session.admit("/v1/responses")
    assert refused.value.limit == "max_turns" and session.stopped == "max_turns"
    full = book.get(book.open(LIMITS))
    call, _ = full.admit("/v1/chat/completions")
    call.prompt_ids, call.response_ids = list(range(15)), list(range(5))  # 20 tokens: the budget
    with pytest.raises(SessionRefused, match="max_trajectory_tokens=20"):
        full.admit("/v1/chat/completions")
    assert full.stopped == "length"


def test_a_request_asks_for_logprobs_a_seed_and_no_more_than_the_budget_allows():
    from vllm import SamplingParams

    book = SessionBook()
    session = book.get(book.open(LIMITS))
    call, seed = session.admit("/v1/chat/completions")
    asked = SamplingParams(max_tokens=16)
    params, wanted = prepared(asked, Recording(session, call, seed), {"prompt_token_ids": [1] * 12})
    assert not wanted and params.logprobs == 0 and params.seed == seed and params.max_tokens == 8
    assert asked.logprobs is None and asked.seed is None  # the caller's params are left as they were
    own = SamplingParams(max_tokens=4, seed=9, logprobs=2)
    params, wanted = prepared(own, Recording(session, call, seed), {"prompt_token_ids": [1] * 12})
    assert wanted and params.logprobs == 2 and params.seed == 9 and params.max_tokens == 4
    with pytest.raises(ValueError, match="max_trajectory_tokens=20"):
        prepared(asked, Recording(session, call, seed), {"prompt_token_ids": [1] * 20})
    assert session.stopped == "length"


def test_a_stream_of_deltas_and_a_final_output_record_the_same_call():
    book = SessionBook()
    session = book.get(book.open(LIMITS))
    streamed, whole = session.add_call("/v1/responses"), session.add_call("/v1/responses")
    take(streamed, output([1, 2], [5], [-0.5], None), delta=True)
    take(streamed, output([1, 2], [6], [-0.25], "stop"), delta=True)
    take(whole, output([1, 2], [5], [-0.5], None), delta=False)
    take(whole, output([1, 2], [5, 6], [-0.5, -0.25], "stop"), delta=False)
    for call in (streamed, whole):
        assert (call.prompt_ids, call.response_ids, call.logprobs, call.finish_reason) == (
            [1, 2],
            [5, 6],
            [-0.5, -0.25],
            "stop",
        )
