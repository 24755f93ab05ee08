"""`tool_math_fc` on the real engine with `tiny-fc-llama` behind vLLM's hermes tool parser: calls come back as
`tool_calls`, each run merges into one experience of the engine's own ids (no drift split, the tool results
masked out), the measured bands hold and match BUILD_INFO.json, a prompt past the context gets a 400 naming
the limit, and a call the parser cannot read is a 200 whose text ends the run as sampled. The framework agents
of examples/agents/*/ (the OpenAI Agents SDK on the Responses API and on Chat Completions, LangGraph on its
own `ChatOpenAI`) give the direct loop's experiences token for token, with no connection off this machine.

All tests share one in-process engine (the module-scoped `fc_engine` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators.engine.client import EngineClient
from operators.rollout.plugins import load_plugins
from operators.rollout.runner import run_task
from operators.workflows.agent import AgentWorkflow
from operators.workflows.base import register_workflow
from operators.workflows.calculator import calculate
from operators.workflows.tool_math_fc import CALL_PREFIX, TOOL_CALL_OPEN, ToolMathFCWorkflow, hermes_call
from pipelines.reference import tool_arith_tasks, tool_model_check
from schemas.config import FC_MODEL
from schemas.task import Task

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"
FRAMEWORKS = [AGENTS / "agents_sdk", AGENTS / "langgraph"]  # one plugin folder each
ROWS = tool_arith_tasks.bundled_splits()["eval"][:12]
FRAMEWORK_ROWS = ROWS[:6]


def run(loop, engine, task: Task) -> dict:
    return loop.run_until_complete(run_task(task, EngineClient(engine), max_timeout=120, max_retry_times=0))


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def tasks(workflow: str, temperature: float, rows: list[dict] = ROWS) -> list[Task]:
    return tool_model_check.eval_tasks(workflow, "tool_arith_eval", rows, 1, 0, temperature=temperature)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_run_merges_into_one_experience_with_the_tool_results_masked(loop, fc_engine, temperature):
    tokenizer = fc_engine.tokenizer
    called = 0
    for task, row in zip(tasks("tool_math_fc", temperature), ROWS, strict=True):
        result = run(loop, fc_engine, task)
        assert result["ok"], result["message"]
        [experience] = result["experiences"]  # one segment: the re-rendered history is what was sampled
        parts = dict(experience["reward_parts"])
        assert json.loads(experience["metrics"])["trajectory_split"] == 0.0
        assert parts["malformed_calls"] == 0.0
        if not parts["tool_calls"]:
            continue
        called += 1
        ids = experience["response_ids"]
        [(start, end)] = experience["inserted_spans"]  # the tool's turn, masked out
        assert experience["action_mask"] == [not start <= i < end for i in range(len(ids))]
        expression = row["prompt"].removeprefix("What is ").removesuffix("?")
        assert decode(tokenizer, ids[:end]) == (  # the sampled call (and its eos), then the tool's turn
            f"{hermes_call(expression)}<|eos|><|tool|>{calculate(expression)}<|eos|><|assistant|>"
        )
        assert decode(tokenizer, ids[end:]).startswith("<answer>")
    assert called >= (12 if temperature == 0.0 else 5)


@pytest.mark.timeout(300)
def test_the_bands_hold_and_match_build_info(loop, fc_engine):
    figures = loop.run_until_complete(tool_model_check.measure_fc(EngineClient(fc_engine), samples=1))
    greedy, sampled = figures["greedy"], figures["temperature_1"]
    assert greedy["call_rate"] >= 0.9 and greedy["parse_rate"] >= 0.95 and greedy["reward"] >= 0.5
    assert sampled["call_rate"] >= 0.6
    assert greedy["drift_splits"] == 0 == sampled["drift_splits"]
    shipped = json.loads((FC_MODEL / "BUILD_INFO.json").read_text())["vllm_fc_figures"]
    for name in ("call_rate", "parse_rate", "reward"):  # BUILD_INFO.json says what is so (in bfloat16)
        assert greedy[name] == pytest.approx(shipped["greedy"][name], abs=0.05), name
    assert sampled["call_rate"] == pytest.approx(shipped["temperature_1"]["call_rate"], abs=0.08)


@register_workflow("test_fc_long_prompt")
class LongPrompt(AgentWorkflow):
    """A prompt short in characters, past the context in tokens (a token a digit): vLLM's count refuses it."""

    async def run_agent(self, task, client, model):
        messages = [{"role": "user", "content": "1" * 300}]
        await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
        return 1.0


@pytest.mark.timeout(120)
def test_a_rendered_prompt_past_the_context_is_refused_with_the_limit_named(loop, fc_engine):
    [task] = tasks("test_fc_long_prompt", 1.0, ROWS[:1])
    row = run(loop, fc_engine, task)
    assert not row["ok"] and row["attempts"] == 1
    assert (
        "the engine refused a request" in row["message"] and "maximum context length is 256" in row["message"]
    )


@register_workflow("test_fc_malformed")
class MalformedCalls(ToolMathFCWorkflow):
    """`tool_math_fc` with the call's JSON head banned, so the model opens a call the parser cannot read."""

    banned: int = 0

    def sampling(self, task):
        return {**super().sampling(task), "logit_bias": {str(self.banned): -100}}


@pytest.mark.timeout(120)
def test_a_call_the_parser_cannot_read_is_a_200_that_ends_the_run_as_sampled(loop, fc_engine):
    MalformedCalls.banned = fc_engine.tokenizer.convert_tokens_to_ids(CALL_PREFIX)
    [task] = tasks("test_fc_malformed", 0.0, ROWS[:1])
    row = run(loop, fc_engine, task)
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    parts = dict(experience["reward_parts"])
    assert parts["malformed_calls"] == 1.0 and parts["tool_calls"] == 0.0 and experience["reward"] == 0.0
    assert experience["turns"] == 1 and all(experience["action_mask"])
    assert decode(fc_engine.tokenizer, experience["response_ids"]).startswith(TOOL_CALL_OPEN)
    assert MalformedCalls.banned not in experience["response_ids"]


@pytest.fixture(scope="module")
def direct_runs(loop, fc_engine) -> list[dict]:
    """`tool_math_fc`'s runs at temperature 1 (seed 0) on the framework tests' tasks: what they must equal."""
    return [run(loop, fc_engine, task) for task in tasks("tool_math_fc", 1.0, FRAMEWORK_ROWS)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workflow", ["agents_sdk_calc", "agents_sdk_calc_chat", "langgraph_calc"])
def test_a_framework_agent_gives_the_direct_loops_experiences_token_for_token(
    loop, fc_engine, direct_runs, loopback_only, workflow
):
    """Same tasks, same seeds: the engine seeds each call from the run's seed, so a framework whose history
    renders to the sampled bytes samples what the direct loop sampled, and its experiences (from the calls the
    engine recorded) hold the same ids, masks and logprobs: one segment each, the tool results masked."""
    for folder in FRAMEWORKS:  # as the configs' `plugin_dirs` do
        load_plugins(folder)
    called = 0
    for task, direct in zip(tasks(workflow, 1.0, FRAMEWORK_ROWS), direct_runs, strict=True):
        row = run(loop, fc_engine, task)
        assert row["ok"], row["message"]
        [experience], [expected] = row["experiences"], direct["experiences"]
        assert json.loads(experience["metrics"])["trajectory_split"] == 0.0
        for key in ("prompt_ids", "response_ids", "action_mask", "inserted_spans", "turns", "reward"):
            assert experience[key] == expected[key], key
        # the same tokens' logprobs, as float32 gives them again (the prompt now from the prefix cache)
        assert experience["logprobs"] == pytest.approx(expected["logprobs"], abs=1e-3)
        parts, expected_parts = dict(experience["reward_parts"]), dict(expected["reward_parts"])
        assert {k: parts[k] for k in ("tool_calls", "called_tool")} == {
            k: expected_parts[k] for k in ("tool_calls", "called_tool")
        }
        called += experience["turns"] > 1
    assert called >= 3  # multi-turn runs, their tool results masked out (checked against the direct loop)
    assert loopback_only.refused == []  # tracing, telemetry and the clients stayed on this machine


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workflow", ["agents_sdk_calc", "agents_sdk_calc_chat", "langgraph_calc"])
def test_a_framework_agents_reply_cut_at_max_tokens_ends_its_run_with_reward_0_as_sampled(
    loop, fc_engine, loopback_only, workflow
):
    """Two tokens leave the call half written: the Agents SDK refuses the Responses API's `incomplete` reply
    (`ModelBehaviorError`), Chat Completions and LangGraph take the text as the answer; each run ends as an
    experience of that one reply, scored 0, not as a failed task."""
    for folder in FRAMEWORKS:
        load_plugins(folder)
    [task] = tasks(workflow, 0.0, ROWS[:1])
    task.rollout_args["max_tokens"] = 2
    row = run(loop, fc_engine, task)
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    assert experience["reward"] == 0.0 and dict(experience["reward_parts"])["tool_calls"] == 0.0
    assert experience["turns"] == 1 and all(experience["action_mask"])
    assert decode(fc_engine.tokenizer, experience["response_ids"]) == TOOL_CALL_OPEN + CALL_PREFIX  # 2 tokens
    assert loopback_only.refused == []
