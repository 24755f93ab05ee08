"""Sessions on the real in-process engine: every generating route gated and recorded on the engine, whatever
client the agent uses (the official `openai` client on chat and responses, bare `httpx`, another process),
the run's limits held there, and hostile requests refused with the engine serving on.

Experiences are checked against what the agent itself was answered: the ids and logprobs of the calls it asked
them for, and the texts of every call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import openai
import pytest
from trajectory_checks import multi_turn_task

from operators.engine.client import EngineClient
from operators.engine.routes import ADMITTED, unclassified
from operators.rollout.runner import run_task
from operators.workflows import AgentWorkflow, register_workflow
from schemas.config import DEFAULT_MODEL
from schemas.task import Task

SCRIPTS = Path(__file__).resolve().parents[1] / "agent_scripts"
SHOWN = {"logprobs": True, "extra_body": {"return_token_ids": True}}  # what the agent asks to see itself
NEXT = "ok, go on"


def make_task(workflow: str, **workflow_args) -> Task:
    return multi_turn_task(workflow, seed=3, **workflow_args)


def run(loop, engine, task: Task, retries: int = 0) -> dict:
    return loop.run_until_complete(
        run_task(task, EngineClient(engine), max_timeout=120, max_retry_times=retries)
    )


def test_every_route_of_vllms_app_is_in_a_table_and_the_generating_ones_are_admitted(engine):
    routes = engine.server.routes
    assert unclassified(routes) == []  # a new vLLM route fails here, not past the gate
    assert set(routes) >= ADMITTED


@register_workflow("test_mixed_api_agent")
class MixedApiAgent(AgentWorkflow):
    """Chat, then the Responses API, then chat again, in one conversation; keeps what it was answered."""

    seen: list[dict] = []

    async def run_agent(self, task, client, model):
        messages = [{"role": "user", "content": task.prompt}]
        seen = []
        for turn in range(3):
            if turn == 1:
                reply = await client.responses.create(
                    model=model, input=messages, max_output_tokens=8, temperature=1.0
                )
                text = reply.output_text
                seen.append({"text": text, "logprobs": reply.output[0].content[0].logprobs})
            else:
                chat = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=8, **SHOWN
                )
                choice = chat.choices[0]
                text = choice.message.content
                lps = [e.logprob for e in choice.logprobs.content]
                seen.append(
                    {"text": text, "prompt": chat.prompt_token_ids, "ids": choice.token_ids, "lps": lps}
                )
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": NEXT}]
        MixedApiAgent.seen = seen
        return 1.0


def test_an_agent_mixing_chat_and_responses_is_recorded_completely_in_order_token_exactly(loop, engine):
    row = run(loop, engine, make_task("test_mixed_api_agent"))
    assert row["ok"], row["message"]
    [experience] = row["experiences"]  # one trajectory: the Responses call extends the chat calls exactly
    first, second, third = MixedApiAgent.seen
    assert not second["logprobs"]  # asked for none: the engine recorded them, and the caller got none
    assert experience["prompt_ids"] == first["prompt"] and experience["turns"] == 3
    ids, mask, lps = experience["response_ids"], experience["action_mask"], experience["logprobs"]
    assert ids[: len(first["ids"])] == first["ids"] and lps[: len(first["ids"])] == pytest.approx(
        first["lps"]
    )
    assert ids[-len(third["ids"]) :] == third["ids"] and lps[-len(third["ids"]) :] == pytest.approx(
        third["lps"]
    )
    assert [*first["prompt"], *ids[: -len(third["ids"])]] == third["prompt"]  # the record is the engine's ids
    sampled = [[]]
    for token, masked in zip(ids, mask, strict=True):
        if masked:
            sampled[-1].append(token)
        elif sampled[-1]:
            sampled.append([])
    texts = [engine.tokenizer.decode(run_ids, skip_special_tokens=True) for run_ids in sampled]
    assert texts == [first["text"], second["text"], third["text"]]
    assert all(lp < 0.0 for lp, m in zip(lps, mask, strict=True) if m)
    assert not engine.sessions.sessions  # collected: nothing piles up


@register_workflow("test_httpx_agent")
class HttpxAgent(AgentWorkflow):
    """Two chat calls with bare httpx: it takes only the endpoint's URL, key and model."""

    async def run_agent(self, task, client, model, endpoint):
        messages = [{"role": "user", "content": task.prompt}]
        headers = {"Authorization": f"Bearer {endpoint.api_key}"}
        async with httpx.AsyncClient(base_url=endpoint.base_url, headers=headers, timeout=60) as http:
            for _ in range(2):
                body = {"model": endpoint.model, "messages": messages, "max_tokens": 6}
                answer = (await http.post("/chat/completions", json=body)).raise_for_status().json()
                messages += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]}]
                messages += [{"role": "user", "content": NEXT}]
        return {"reward": 0.5, "texts": float(len(messages))}


def test_an_agent_on_bare_httpx_with_only_the_url_and_key_is_recorded(loop, engine):
    row = run(loop, engine, make_task("test_httpx_agent"))
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    assert experience["turns"] == 2 and experience["reward"] == 0.5
    assert sum(experience["action_mask"]) >= 2 and not engine.sessions.sessions


def test_an_agent_process_with_only_the_environment_is_recorded_and_scored_by_its_last_line(loop, engine):
    task = make_task("command_agent", command=f"{sys.executable} {SCRIPTS / 'two_turns.py'}")
    row = run(loop, engine, task)
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    assert experience["turns"] == 2 and experience["reward"] == 1.0 and experience["reward_parts"]
    assert not engine.sessions.sessions


def test_an_agent_process_past_its_timeout_is_killed_with_its_children(loop, engine, tmp_path):
    task = make_task("command_agent", command=[sys.executable, str(SCRIPTS / "two_turns.py"), "--sleep"])
    task.workflow_args["timeout"] = 3
    row = run(loop, engine, task)
    assert not row["ok"] and "workflow_args.timeout=3s" in row["message"]
    assert not engine.sessions.sessions  # the failed run's session is gone too
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and b"time.sleep(600)" in cmdline(p)]
    assert leftovers == []


def cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_swap_holds_a_responses_call_which_then_carries_the_new_version(loop, engine):
    version = engine.model_version

    async def scenario() -> dict:
        engine.open.clear()  # a swap begins: the agent's call must wait at the gate
        run_ = asyncio.ensure_future(
            run_task(
                make_task("test_responses_agent"), EngineClient(engine), max_timeout=60, max_retry_times=0
            )
        )
        await asyncio.sleep(0.5)
        assert engine.in_flight == 0 and not run_.done()
        await engine.load_checkpoint(str(DEFAULT_MODEL), version + 1)
        return await run_

    try:
        row = loop.run_until_complete(scenario())
    finally:
        engine.open.set()
        loop.run_until_complete(engine.load_checkpoint(str(DEFAULT_MODEL), version))
    assert row["ok"], row["message"]
    [experience] = row["experiences"]
    assert experience["model_version"] == version + 1
    assert {v for v, m in zip(experience["token_versions"], experience["action_mask"], strict=True) if m} == {
        version + 1
    }


@register_workflow("test_responses_agent")
class ResponsesAgent(AgentWorkflow):
    async def run_agent(self, task, client, model):
        await client.responses.create(model=model, input=task.prompt, max_output_tokens=6)
        return 1.0


# -- hostile requests ---------------------------------------------------------------------------------------


def request(loop, engine, path: str, body: dict | bytes, key: str | None) -> httpx.Response:
    url, _, _ = engine.openai_endpoint()
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            if isinstance(body, bytes):
                return await http.post(f"{url}{path}", content=body, headers=headers)
            return await http.post(f"{url}{path}", json=body, headers=headers)

    return loop.run_until_complete(go())


def chat(**extra) -> dict:
    return {
        "model": "tiny-arith-llama",
        "messages": [{"role": "user", "content": "1+1="}],
        "max_tokens": 2,
        **extra,
    }


def test_hostile_requests_get_a_clear_4xx_record_nothing_and_the_engine_serves_on(loop, engine):
    key = engine.open_session(8, 10_000, 30.0, 0, ["hostile", 0])
    other = engine.open_session(8, 10_000, 30.0, 0, ["other", 0])
    try:
        assert request(loop, engine, "/chat/completions", chat(), None).status_code == 401
        assert request(loop, engine, "/chat/completions", chat(), "rft-made-up").status_code == 401
        big = json.dumps(chat(padding="x" * (engine.rollout.max_request_bytes + 1))).encode()
        assert request(loop, engine, "/chat/completions", big, key).status_code == 413
        long = chat(messages=[{"role": "user", "content": "1+1=" * 5000}])
        assert request(loop, engine, "/chat/completions", long, key).status_code == 400
        for field, value in [("previous_response_id", "resp_unknown"), ("background", True)]:
            body = {"model": "tiny-arith-llama", "input": "hi", field: value}
            answer = request(loop, engine, "/responses", body, key)
            assert answer.status_code == 400 and field.split("_")[0] in answer.json()["error"]["message"]
        assert request(loop, engine, "/chat/completions/batch", chat(), key).status_code == 403
        assert request(loop, engine, "/chat/completions", chat(), key).status_code == 200  # still serving
        assert len(engine.collect_session(key)["calls"]) == 1 and engine.collect_session(other)["calls"] == []
        assert request(loop, engine, "/chat/completions", chat(), key).status_code == 401  # finished
    finally:
        engine.close_session(key)
        engine.close_session(other)


def test_a_stream_the_client_drops_halfway_frees_the_request_and_records_what_was_sampled(loop, engine):
    key = engine.open_session(8, 10_000, 30.0, 0, ["dropped", 0])
    url, model, _ = engine.openai_endpoint()

    async def drop() -> int:
        async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0) as client:
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Count:"}],
                max_tokens=200,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            got = 0
            async for chunk in stream:
                got += sum(1 for c in chunk.choices if c.delta.content)
                if got >= 3:
                    break
            await stream.close()
        for _ in range(200):  # the engine sees the disconnect and frees the request
            if engine.in_flight == 0 and not engine.llm.output_processor.request_states:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError("the dropped stream's request is still in the engine")

    loop.run_until_complete(asyncio.wait_for(drop(), 60))
    [call] = engine.collect_session(key)["calls"]
    assert 3 <= len(call["response_ids"]) < 200 and call["finish_reason"] == "abort"
    assert len(call["logprobs"]) == len(call["response_ids"])
