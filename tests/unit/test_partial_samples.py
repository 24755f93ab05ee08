"""Partial rollout without an engine: how a cut sample grows (`Draft`), how its per-token versions reach the
experience (single calls and multi-turn segments), and the `mask_old_tokens` op on an experience table."""

from __future__ import annotations

from types import SimpleNamespace

from unit_factories import make_experience

from operators.engine.samples import CUT, Draft
from operators.ops.registry import build_op
from operators.workflows.trajectory import Call, assemble
from schemas.experience import experiences_to_table


def choice(ids: list[int], finish: str | None, text: str = "") -> SimpleNamespace:
    """A vLLM CompletionOutput's fields as the engine reads them (sampled-token logprob entries)."""
    logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(ids)]
    return SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish, text=text)


def test_a_cut_sample_keeps_its_tokens_and_goes_on_with_what_is_left():
    draft = Draft()
    draft.add(choice([5, 6, 7], CUT), version=3)
    assert draft.cut
    rest = draft.rest({"n": 4, "max_tokens": 10, "seed": 11, "temperature": 1.0}, index=2)
    assert rest["n"] == 1 and rest["max_tokens"] == 7 and rest["temperature"] == 1.0
    assert rest["seed"] != 11  # not the beginning's random stream again
    assert rest == draft.rest(
        {"n": 4, "max_tokens": 10, "seed": 11, "temperature": 1.0}, index=2
    )  # reproducible
    draft.add(choice([8, 9], "stop", "tail"), version=4)
    sample = draft.sample("whole text")
    assert sample.response_ids == [5, 6, 7, 8, 9] and sample.finish_reason == "stop"
    assert sample.token_versions == [3, 3, 3, 4, 4] and sample.text == "whole text"
    assert len(sample.logprobs) == 5


def test_an_uncut_sample_reports_no_per_token_versions():
    draft = Draft()
    draft.add(choice([1, 2], "length", "ab"), version=0)
    sample = draft.sample()
    assert sample.token_versions is None and sample.text == "ab" and not draft.cut


def test_a_sample_cut_before_it_sampled_anything_continues_whole_and_one_out_of_budget_ends():
    draft = Draft()
    draft.add(None, version=2)
    assert draft.cut and draft.rest({"max_tokens": 5, "seed": None}, 0) == {
        "max_tokens": 5,
        "seed": None,
        "n": 1,
    }
    spent = Draft()
    spent.add(choice([1, 2, 3], CUT), version=2)
    assert spent.rest({"max_tokens": 3}, 0) is None and spent.finish_reason == "length"


def test_multi_turn_segments_keep_each_calls_per_token_versions():
    first = Call([1, 2], [3, 4, 5], [-0.1] * 3, 0, "stop", token_versions=[0, 0, 1])
    second = Call([1, 2, 3, 4, 5, 9], [6], [-0.2], 1, "stop")
    (segment,) = assemble([first, second])
    assert segment.token_versions == [0, 0, 1, -1, 1]  # the inserted id (9) is nobody's sample
    assert segment.model_version == 0  # the oldest sampled token


def test_mask_old_tokens_trains_only_on_the_newest_versions_tokens():
    rows = [
        make_experience(run_id=0, n_tokens=4, token_versions=[2, 2, 3, 3]),
        make_experience(run_id=1, n_tokens=3, token_versions=[2, -1, 2], action_mask=[True, False, True]),
        make_experience(run_id=2, n_tokens=2),  # one version: nothing to mask
    ]
    masked = build_op("mask_old_tokens", {})(experiences_to_table(rows))
    assert masked.column("action_mask").to_pylist() == [
        [False, False, True, True],
        [True, False, True],
        [True, True],
    ]
    assert masked.column("response_ids").to_pylist() == [r.response_ids for r in rows]  # ids stay, as context
