"""Serve mode on the real stack: the front (real HTTP) before the pytest session's engine actor, the official
`openai` client as the scripted user, rewards, commits through the Parquet sink, and Trinity's client shape.

The committed experiences are checked against what the user was answered (the user asks for the token ids
and logprobs itself, which the front passes on), token for token, with each reward on its call.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from integration_settings import BASE

from operators.sinks.parquet import ParquetSink
from pipelines.serving.service import Service
from schemas.config import load_config

SHOWN = {"logprobs": True, "extra_body": {"return_token_ids": True}}


@pytest.fixture(scope="module")
def front(loop, engines, tmp_path_factory):
    """A front on the session's engines, on a free port of 127.0.0.1; stopped at the end of the module."""
    run_dir = tmp_path_factory.mktemp("serve")
    cfg = load_config(None, [*BASE, "mode=serve", "serve.port=0", "serve.max_concurrent=8"])
    service = Service(cfg, run_dir, fleet=engines)
    started = loop.run_until_complete(service.start())
    yield service, started.url, run_dir
    loop.run_until_complete(service.stop())


def call(loop, coroutine):
    return loop.run_until_complete(asyncio.wait_for(coroutine, 120))


async def post(url: str, path: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        return (await http.post(path)).json()


async def user_session(url: str, turns: int, reward_turns: dict[int, float]) -> dict:
    """A scripted user: opens a session, chats `turns` times (streaming the second), rewards some calls."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        opened = (await http.post("/sessions")).raise_for_status().json()
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key=opened["api_key"], max_retries=0
        ) as client:
            model = (await client.models.list()).data[0].id
            messages, seen = [{"role": "user", "content": "12+7="}], []
            for turn in range(turns):
                chat = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=6, temperature=1.0, seed=turn, **SHOWN
                )
                choice = chat.choices[0]
                lps = [e.logprob for e in choice.logprobs.content]
                seen.append(
                    {"id": chat.id, "prompt": chat.prompt_token_ids, "ids": choice.token_ids, "lps": lps}
                )
                messages += [{"role": "assistant", "content": choice.message.content}]
                messages += [{"role": "user", "content": "and 3+4="}]
                if turn in reward_turns:
                    body = {"reward": reward_turns[turn], "call_id": chat.id}
                    sid = opened["session_id"]
                    rewarded = (await http.post(f"/sessions/{sid}/reward", json=body)).raise_for_status()
                    assert rewarded.json()["applied"] is True
        (await http.post(f"/sessions/{opened['session_id']}/end")).raise_for_status()
    return {"session": opened, "seen": seen}


def test_served_sessions_are_committed_token_for_token_with_each_reward_on_its_call(loop, front):
    service, url, run_dir = front

    async def users_then_commit() -> tuple[list[dict], dict]:
        users = await asyncio.gather(user_session(url, 2, {0: 1.0, 1: 0.25}), user_session(url, 1, {0: 0.5}))
        return users, await post(url, "/commit")

    users, committed = call(loop, users_then_commit())
    assert committed["step"] is not None and committed["experiences"] == 3
    table = ParquetSink(run_dir / "experiences").read_step(committed["step"])
    rows = {(r["task_uid"], r["run_id"]): r for r in table.to_pylist()}
    expected = {0: [1.0, 0.25], 1: [0.5]}
    for u, user in enumerate(users):
        for seq, seen in enumerate(user["seen"]):
            row = rows[(f"serve/{user['session']['session_id']}", seq)]
            assert row["prompt_ids"] == seen["prompt"] and row["response_ids"] == seen["ids"]
            assert row["logprobs"] == pytest.approx(seen["lps"]) and row["reward"] == expected[u][seq]
            assert all(row["action_mask"])
    again = call(loop, post(url, "/commit"))
    assert again["step"] is None  # nothing twice


def test_a_trinity_shaped_client_calls_without_a_session_rewards_by_ids_and_commits(loop, front):
    service, url, run_dir = front

    async def trinity_user() -> tuple[list[str], dict, dict]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0) as client:
            model = (await client.models.list()).data[0].id
            ids = []
            for prompt in ("1+1=", "2+2="):
                chat = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4
                )
                ids.append(chat.id)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            feedback = await http.post("/feedback", json={"msg_ids": ids, "reward": 0.75, "task_id": "t1"})
            assert feedback.json()["status"] == "success"
            metrics = (await http.get("/metrics")).json()
            committed = (await http.post("/commit")).json()
            health = await http.get("/health")
            assert health.status_code == 200
        return ids, metrics, committed

    ids, metrics, committed = call(loop, trinity_user())
    assert metrics["rollout/total_experience_count"] >= 2 and "rollout/model_0/model_version" in metrics
    assert committed["status"] == "success" and committed["experiences"] == 2
    table = ParquetSink(run_dir / "experiences").read_step(committed["step"])
    assert set(table.column("task_uid").to_pylist()) == {"serve/t1"}
    assert table.column("reward").to_pylist() == [0.75, 0.75]


def test_hostile_calls_get_clear_4xx_and_the_front_serves_on(loop, front):
    service, url, run_dir = front

    async def hostile() -> dict[str, int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            opened = (await http.post("/sessions")).json()
            sid, key = opened["session_id"], opened["api_key"]
            body = {
                "model": "tiny-arith-llama",
                "messages": [{"role": "user", "content": "1+1="}],
                "max_tokens": 2,
            }
            first = await http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            reward = {"reward": 1.0, "call_id": first.json()["id"]}
            statuses = {
                "first": first.status_code,
                "reward": (await http.post(f"/sessions/{sid}/reward", json=reward)).status_code,
                "double": (await http.post(f"/sessions/{sid}/reward", json=reward)).json()["applied"],
                "unknown_call": (
                    await http.post(f"/sessions/{sid}/reward", json={"reward": 1, "call_id": "x"})
                ).status_code,
                "unknown_session": (await http.post("/sessions/nope/reward", json={"reward": 1})).status_code,
                "made_up_key": (
                    await http.post(
                        "/v1/chat/completions", json=body, headers={"Authorization": "Bearer rfs-made-up"}
                    )
                ).status_code,
                "oversized": (
                    await http.post(
                        "/v1/chat/completions",
                        content=b"x" * (9 * 2**20),
                        headers={"Authorization": f"Bearer {key}"},
                    )
                ).status_code,
            }
            await http.post(f"/sessions/{sid}/end")
            statuses["ended_key"] = (
                await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            ).status_code
            flood_body = {**body, "max_tokens": 64, "extra": None}
            flood = await asyncio.gather(
                *(
                    http.post("/v1/chat/completions", json={**flood_body, "ignore_eos": True})
                    for _ in range(24)
                )
            )
            statuses["flood_429"] = sum(r.status_code == 429 for r in flood)
            statuses["flood_200"] = sum(r.status_code == 200 for r in flood)
            statuses["after"] = (await http.post("/v1/chat/completions", json=body)).status_code
        return statuses

    got = call(loop, hostile())
    assert got["first"] == 200 and got["reward"] == 200 and got["double"] is False
    assert got["unknown_call"] == 404 and got["unknown_session"] == 404
    assert got["made_up_key"] == 401 and got["ended_key"] == 401 and got["oversized"] == 413
    assert got["flood_429"] > 0 and got["flood_200"] > 0 and got["after"] == 200
    # a non-local address without a key is refused before anything starts, naming the key
    with pytest.raises(ValueError, match="serve.admin_key"):
        load_config(None, ["serve.host=0.0.0.0"])


def test_the_prometheus_text_and_json_metrics_agree(loop, front):
    service, url, _ = front

    async def both() -> tuple[dict, str]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            return (await http.get("/metrics")).json(), (
                await http.get("/metrics", headers={"Accept": "text/plain"})
            ).text

    as_json, text = call(loop, both())
    assert (
        f"rftflow_explore_step_num {float(as_json['explore_step_num'])}" in text
        or "rftflow_explore_step_num" in text
    )
    assert json.dumps(as_json)  # plain JSON values
