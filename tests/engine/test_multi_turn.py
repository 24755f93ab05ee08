"""Multi-turn workflows on the real in-process engine: `EnvWorkflow` over the engine client, `AgentWorkflow`
over vLLM's OpenAI API with the official `openai` client, and the trajectories they become.

Every experience is checked against what the engine returned, call by call: the ids are the engine's, the
action mask is true exactly on sampled tokens, and every masked span decodes to the text inserted there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
from integration_settings import ENGINE_API_KEY
from trajectory_checks import SpyClient, check_exact, multi_turn_task

from operators.engine.client import EngineClient
from operators.rollout.plugins import load_plugins
from operators.rollout.runner import run_task
from operators.workflows import AgentWorkflow, EnvWorkflow, MalformedAction, register_workflow
from schemas.engine_config import RolloutModelConfig
from schemas.task import Task

OBSERVATION = "ok, go on"


class FixedEnv:
    """Answers every reply with the same observation and ends after `turns` steps; reward 1 a step."""

    def __init__(self, turns: int = 3, malformed_at: int | None = None, fail_at: int | None = None):
        self.turns, self.malformed_at, self.fail_at, self.steps = turns, malformed_at, fail_at, 0

    def reset(self, task: Task) -> str:
        return task.prompt

    async def step(self, action: str) -> tuple[str, float, bool]:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the environment's simulator crashed")
        if self.steps == self.malformed_at:
            raise MalformedAction("no <calc> expression in the reply")
        return OBSERVATION, 1.0, self.steps >= self.turns


@register_workflow("test_fixed_env")
class FixedEnvWorkflow(EnvWorkflow):
    def make_env(self, task: Task) -> FixedEnv:
        return FixedEnv(**task.workflow_args.get("env", {}))


def make_task(workflow: str, repeat: int = 1, **workflow_args) -> Task:
    return multi_turn_task(workflow, repeat, **workflow_args)


def run(loop, engine, task: Task, client: EngineClient | None = None) -> dict:
    return loop.run_until_complete(
        run_task(task, client or EngineClient(engine), max_timeout=120, max_retry_times=0)
    )


def test_an_env_run_is_one_experience_holding_the_engines_ids_call_by_call(loop, engine):
    spy = SpyClient(engine)
    row = run(loop, engine, make_task("test_fixed_env"), spy)
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    calls = [(g.prompt_ids, g.samples[0].response_ids, g.samples[0].logprobs) for g in spy.generations]
    assert len(calls) == 3
    check_exact(experience, calls, engine.tokenizer, [OBSERVATION] * 2)
    assert True in experience["action_mask"] and False in experience["action_mask"]
    assert experience["reward"] == 3.0 and experience["segment"] == 0
    assert experience["uid"] == "test_fixed_env/e0/0/0"


def test_a_malformed_action_is_answered_with_an_error_observation(loop, engine):
    spy = SpyClient(engine)
    row = run(loop, engine, make_task("test_fixed_env", env={"malformed_at": 1}), spy)
    assert row["ok"], row["message"]
    second_prompt = engine.decode(spy.generations[1].prompt_ids)
    assert "error: no <calc> expression in the reply" in second_prompt
    assert row["experiences"][0]["reward"] == 2.0  # the malformed step earned nothing, the run went on


def test_an_environment_that_raises_fails_the_task_with_its_message(loop, engine):
    row = run(loop, engine, make_task("test_fixed_env", env={"fail_at": 2}))
    assert not row["ok"] and row["experiences"] == []
    assert "the environment's simulator crashed" in row["message"]


def test_the_trajectory_token_budget_ends_a_run_with_finish_reason_length(loop, engine):
    row = run(
        loop, engine, make_task("test_fixed_env", env={"turns": 50}, max_turns=50, max_trajectory_tokens=40)
    )
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    assert experience["finish_reason"] == "length"
    assert len(experience["prompt_ids"]) + len(experience["response_ids"]) <= 40


# -- agents on the OpenAI API -------------------------------------------------------------------------------


AGENT_PLUGINS = Path(__file__).resolve().parents[1] / "agent_plugins"


@pytest.fixture(scope="module")
def agent_plugin() -> Path:
    load_plugins(AGENT_PLUGINS)  # as --plugin-dir does
    return AGENT_PLUGINS


def test_an_agent_plugin_on_the_official_client_streaming_included_is_recorded_exactly(
    loop, engine, agent_plugin, tmp_path
):
    record = tmp_path / "seen.json"
    row = run(loop, engine, make_task("test_openai_agent", record_to=str(record)))
    assert row["ok"], row["message"]
    seen = json.loads(record.read_text())
    assert len(seen) == 3 and all(prompt and ids for prompt, ids, _ in seen)  # the stream had its ids too
    experiences = row["experiences"]
    assert [e["segment"] for e in experiences] == list(range(len(experiences)))
    if len(experiences) == 1:  # the tiny model's replies re-render to their own ids: one trajectory
        check_exact(experiences[0], seen, engine.tokenizer, [OBSERVATION] * 2)
    assert dict(experiences[0]["reward_parts"]) == {"turns_seen": 3.0}


def test_an_edited_history_splits_the_trajectory_into_segments(loop, engine, agent_plugin, tmp_path):
    record = tmp_path / "seen.json"
    row = run(loop, engine, make_task("test_openai_agent", record_to=str(record), edit_history=True))
    assert row["ok"], row["message"]
    seen = json.loads(record.read_text())
    experiences = row["experiences"]
    assert [e["segment"] for e in experiences] == [0, 1]
    assert [e["uid"] for e in experiences] == ["test_openai_agent/e0/0/0", "test_openai_agent/e0/0/0/s1"]
    check_exact(experiences[0], seen[:2], engine.tokenizer, [OBSERVATION])
    assert experiences[1]["prompt_ids"] == seen[2][0] and experiences[1]["response_ids"] == seen[2][1]
    assert [json.loads(e["metrics"])["trajectory_split"] for e in experiences] == [0.0, 1.0]


def test_per_call_mode_makes_one_experience_per_call(loop, engine, agent_plugin, tmp_path):
    task = make_task("test_openai_agent", record_to=str(tmp_path / "seen.json"), trajectory="per_call")
    row = run(loop, engine, task)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert [(e["prompt_ids"], e["response_ids"]) for e in row["experiences"]] == [(p, r) for p, r, _ in seen]
    assert all(all(e["action_mask"]) for e in row["experiences"])


@register_workflow("test_endless_agent")
class EndlessAgent(AgentWorkflow):
    async def run_agent(self, task, client, model):
        messages = [{"role": "user", "content": task.prompt}]
        while True:  # never stops by itself: max_turns must
            reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
            messages += [{"role": "user", "content": OBSERVATION}]


def test_max_turns_ends_an_agent_that_never_stops(loop, engine):
    row = run(loop, engine, make_task("test_endless_agent", max_turns=3))
    assert row["ok"], row["message"]
    assert sum(e["turns"] for e in row["experiences"]) == 3
    assert row["experiences"][-1]["finish_reason"] == "max_turns"


@register_workflow("test_long_prompt_agent")
class LongPromptAgent(AgentWorkflow):
    async def run_agent(self, task, client, model):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "1+1=" * 500_000}], max_tokens=4
        )
        return 1.0


def test_a_prompt_over_the_limit_is_refused_at_once_over_http_and_not_retried(loop, engine):
    row = loop.run_until_complete(
        run_task(make_task("test_long_prompt_agent"), EngineClient(engine), max_timeout=60, max_retry_times=2)
    )
    assert not row["ok"] and row["attempts"] == 1
    assert "the engine refused a request" in row["message"] and "max_model_len - max_tokens" in row["message"]


# -- the endpoint itself ------------------------------------------------------------------------------------


def test_a_non_local_host_needs_the_api_key_on_every_request(loop, engine):
    url, model, key = engine.openai_endpoint()
    assert key == ENGINE_API_KEY and not url.startswith("http://0.0.0.0")

    async def ask(headers: dict) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as http:
            body = {"model": model, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2}
            return await http.post(f"{url}/chat/completions", json=body, headers=headers)

    assert loop.run_until_complete(ask({})).status_code == 401
    answered = loop.run_until_complete(ask({"Authorization": f"Bearer {ENGINE_API_KEY}"}))
    assert answered.status_code == 200 and answered.headers["x-rftflow-model-version"] == "0"
    with pytest.raises(ValueError, match="set api_key too"):
        RolloutModelConfig(enable_openai_api=True, host="0.0.0.0")


def test_models_lists_the_served_model(loop, engine):
    url, model, key = engine.openai_endpoint()

    async def models() -> list[str]:
        async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0) as client:
            return [m.id for m in (await client.models.list()).data]

    assert loop.run_until_complete(models()) == [model] == ["tiny-arith-llama"]


def test_many_seeded_requests_longer_than_one_prefill_step_leave_the_engine_alive(loop, engine):
    """Past 2048 prompt tokens in flight, vLLM 0.32 on CPU with chunked prefill died on seeded requests
    ('CPU Generator does not use offset'); multi-turn prompts get there. On CPU it is off by default."""
    prompt = "12+7=" * 40

    async def many() -> list[dict]:
        sampling = [{"max_tokens": 4, "seed": i, "n": 1} for i in range(64)]
        return await asyncio.gather(*(engine.generate(prompt, s) for s in sampling))

    outputs = loop.run_until_complete(many())
    assert all(len(o["samples"][0]["response_ids"]) >= 1 for o in outputs)
    assert sum(len(o["prompt_ids"]) for o in outputs) > 2048
