"""`tool_math` and `openai_calc_agent` on the real engine with the tiny tool model: the model calls the
calculator on some prompts and not others, the trajectories hold exactly the engine's ids (tool results
masked out), and the measured tool-call rate and rewards lie in the bands the learning loop needs.

All tests share one in-process engine on `pipelines/assets/tiny-tool-llama` (the `tool_engine` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trajectory_checks import SpyClient, check_exact

from operators.engine.client import EngineClient
from operators.rollout.plugins import load_plugins
from operators.rollout.runner import run_task
from operators.workflows.calculator import calculate
from operators.workflows.tool_math import CALL
from pipelines.reference import tool_arith_tasks, tool_model_check
from schemas.config import TOOL_MODEL
from schemas.task import Task

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"
ROWS = tool_arith_tasks.bundled_splits()["eval"][:12]


def tasks(workflow: str) -> list[Task]:
    return tool_model_check.eval_tasks(workflow, "tool_arith_eval", ROWS, samples=1, seed=0)


def run_all(loop, client: EngineClient, batch: list[Task]) -> list[dict]:
    """Each task's result row, one task at a time (so each run's calls are the spy's next generations)."""
    return [
        loop.run_until_complete(run_task(task, client, max_timeout=120, max_retry_times=0)) for task in batch
    ]


@pytest.fixture(scope="module")
def env_runs(loop, tool_engine) -> list[tuple[dict, list]]:
    """Each `tool_math` task's one experience and the engine's generations for it."""
    runs = []
    for task in tasks("tool_math"):
        spy = SpyClient(tool_engine)
        [row] = run_all(loop, spy, [task])
        assert row["ok"], row["message"]
        [experience] = row["experiences"]
        runs.append((experience, spy.generations))
    return runs


@pytest.mark.timeout(300)
def test_tool_math_runs_hold_the_engines_ids_with_tool_results_masked_out(env_runs, tool_engine):
    called = [(e, g) for e, g in env_runs if dict(e["reward_parts"])["called_tool"]]
    direct = [(e, g) for e, g in env_runs if not dict(e["reward_parts"])["called_tool"]]
    assert called and direct  # the model decided both ways on these prompts
    for experience, generations in env_runs:
        calls = [(g.prompt_ids, g.samples[0].response_ids, g.samples[0].logprobs) for g in generations]
        replies = [g.samples[0].text for g in generations]
        results = [calculate(CALL.search(text).group(1)) for text in replies[:-1]]  # each call's answer
        check_exact(experience, calls, tool_engine.tokenizer, [f"<|tool|>{r}<|eos|>" for r in results])
        assert dict(experience["reward_parts"])["tool_calls"] == len(results)
    for experience, _ in called:
        assert True in experience["action_mask"] and False in experience["action_mask"]
        assert "<|tool|>" in experience["response_text"]
    for experience, generations in direct:
        assert all(experience["action_mask"]) and len(generations) == 1
    rewards = {e["reward"] for e, _ in env_runs}
    assert rewards <= {0.0, 1.0} and 1.0 in rewards


@pytest.mark.timeout(600)
def test_tool_call_rate_and_rewards_lie_in_their_bands(loop, tool_engine):
    figures = loop.run_until_complete(tool_model_check.measure(EngineClient(tool_engine)))
    assert 0.2 <= figures["tool_call_rate"] <= 0.6
    assert 0.1 < figures["tool_math_reward"] < 0.7
    assert 0.1 < figures["arith_reward"] < 0.9
    shipped = json.loads((TOOL_MODEL / "BUILD_INFO.json").read_text())["vllm_tool_figures"]
    for name in ("tool_call_rate", "tool_math_reward", "arith_reward"):  # BUILD_INFO.json says what is so
        assert figures[name] == pytest.approx(shipped[name], abs=0.05)


@pytest.mark.timeout(300)
def test_openai_calc_agent_loaded_as_a_plugin_gives_the_env_workflows_trajectories(
    loop, tool_engine, env_runs
):
    """Same seeds, same prompts: the agent on the OpenAI API samples what `tool_math` sampled, and its
    experiences (from the calls its client recorded) hold the same ids and masks, so they are exact too."""
    load_plugins(AGENTS)  # as --plugin-dir examples/agents does
    rows = run_all(loop, EngineClient(tool_engine), tasks("openai_calc_agent"))
    assert any(dict(e["reward_parts"])["called_tool"] for e, _ in env_runs)  # so the agent called it too
    for row, (env_experience, _) in zip(rows, env_runs, strict=True):
        assert row["ok"], row["message"]
        [experience] = row["experiences"]
        for key in ("prompt_ids", "response_ids", "action_mask", "inserted_spans", "reward"):
            assert experience[key] == env_experience[key], key
        assert experience["logprobs"] == pytest.approx(env_experience["logprobs"], abs=1e-4)
        assert dict(experience["reward_parts"]) == dict(env_experience["reward_parts"])
