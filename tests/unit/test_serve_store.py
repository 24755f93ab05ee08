"""Serve mode's store and commits without Ray or an engine: rewards applied once, the unrewarded policy, a
commit cut by a crash finished at start-up (written once, never twice), the Trinity keys of serve mode, and
the refusal of a non-local front without a key."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from operators.sinks.parquet import ParquetSink
from pipelines.serving.commits import Committer, fragment_name
from pipelines.serving.store import RewardError, ServeStore
from schemas.config import DEFAULT_MODEL, load_config
from schemas.errors import InputError
from schemas.serve_config import ServeConfig

TOKENIZER = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))


def record(prompt: list[int], response: list[int]) -> dict:
    lps = [-0.5] * len(response)
    return {"route": "/v1/chat/completions", "prompt_ids": prompt, "response_ids": response, "logprobs": lps,
            "model_version": 2, "finish_reason": "stop"}  # fmt: skip


def served(tmp_path, **settings):
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = ServeStore(f"sqlite:///{tmp_path / 'serve.db'}")
    sink = ParquetSink(tmp_path / "experiences")
    return store, sink, Committer(store, sink, ServeConfig(**settings), [], TOKENIZER)


def test_a_reward_is_applied_once_and_an_unknown_or_committed_call_is_refused(tmp_path):
    store, _, committer = served(tmp_path)
    store.open_session("s1", "rfs-1")
    store.record_call("c1", "s1", record([1, 2], [3]))
    assert store.reward(["c1"], 1.0, "s1") == ["c1"]
    assert store.reward(["c1"], 0.0, "s1") == []  # a repeat applies to nothing
    with pytest.raises(RewardError) as unknown:
        store.reward(["nope"], 1.0, "s1")
    assert unknown.value.status == 404
    store.record_call("c2", "s1", record([1, 2, 3, 4], [5]))
    store.end_session("s1")
    assert committer.commit()["step"] == 1  # c2 unrewarded: dropped by default
    with pytest.raises(RewardError) as late:
        store.reward(["c2"], 1.0, "s1")
    assert late.value.status == 409


def test_per_call_experiences_carry_each_calls_ids_and_reward_and_merge_makes_one_trajectory(tmp_path):
    for trajectory, expected in [("per_call", 2), ("merge", 1)]:
        store, sink, committer = served(tmp_path / trajectory, trajectory=trajectory, unrewarded="zero")
        store.open_session("s", "rfs-s")
        store.record_call("a", "s", record([1, 2], [3, 4]))
        store.record_call("b", "s", record([1, 2, 3, 4, 9], [5]))
        store.reward(["b"], 0.5, "s")
        store.end_session("s")
        result = committer.commit()
        table = sink.read_step(result["step"]).to_pylist()
        assert len(table) == expected and {r["task_uid"] for r in table} == {"serve/s"}
        if trajectory == "per_call":
            assert [(r["prompt_ids"], r["response_ids"], r["reward"]) for r in table] == [
                ([1, 2], [3, 4], 0.0),
                ([1, 2, 3, 4, 9], [5], 0.5),
            ]
        else:
            [row] = table
            assert row["response_ids"] == [3, 4, 9, 5] and row["action_mask"] == [True, True, False, True]
            assert row["reward"] == 0.5 and row["turns"] == 2


def test_an_open_session_is_not_committed_and_a_sessionless_call_is_when_rewarded(tmp_path):
    store, sink, committer = served(tmp_path)
    store.open_session("s", "rfs-s")
    store.open_session("sessionless", None, kind="sessionless")
    store.record_call("open", "s", record([1], [2]))
    store.reward(["open"], 1.0, "s")
    store.record_call("free", "sessionless", record([7], [8]))
    store.reward(["free"], 0.25, None, task_id="t9")
    result = committer.commit()
    assert result["calls"] == 1
    [row] = sink.read_step(result["step"]).to_pylist()
    assert row["task_uid"] == "serve/t9" and row["reward"] == 0.25


@pytest.mark.parametrize("cut_after_sink", [False, True])
def test_a_commit_cut_by_a_crash_is_finished_at_start_up_exactly_once(tmp_path, cut_after_sink):
    store, sink, committer = served(tmp_path)
    store.open_session("s", "rfs-s")
    store.record_call("c", "s", record([1, 2], [3]))
    store.reward(["c"], 1.0, "s")
    store.end_session("s")
    calls, dropped = store.ready("drop")
    store.plan_commit(1, [c.id for c in calls], dropped)  # the crash comes after the plan ...
    if cut_after_sink:
        committer.write(1, calls)  # ... or after the sink's commit, before the store heard of it
    store.close()
    store, sink, committer = served(tmp_path)  # a new front on the same run dir
    assert committer.recover() == [1]
    assert sink.committed_steps() == [1] and sink.read_step(1).num_rows == 1
    assert [p.name for p in (tmp_path / "experiences" / "step_000001").iterdir()] == [fragment_name(1)]
    assert committer.commit()["step"] is None and store.planned() == []  # nothing twice


def test_interrupted_sessions_are_reported_and_their_keys_stop_working(tmp_path):
    store, _, _ = served(tmp_path)
    store.open_session("s", "rfs-s")
    assert store.interrupt_open_sessions() == ["s"]
    assert store.session_of_key("rfs-s") == ("s", "interrupted")


def test_trinity_serve_keys_translate_and_its_open_default_address_needs_a_key(tmp_path):
    trinity = tmp_path / "trinity.yaml"
    base = f"mode: serve\nproject: p\nname: n\ncheckpoint_root_dir: {tmp_path}\n"
    base += "algorithm: {algorithm_type: grpo}\n"
    trinity.write_text(
        base + "explorer: {proxy_port: 8020, listen_address: 127.0.0.1, min_running_model_num: 1, "
        "service_status_check_interval: 7, db_url: 'sqlite:////tmp/x.db'}\n"
    )
    cfg = load_config(trinity, [])
    assert (cfg.mode, cfg.serve.port, cfg.serve.host, cfg.serve.health_check_interval_s) == (
        "serve",
        8020,
        "127.0.0.1",
        7,
    )
    assert cfg.serve.db_url == "sqlite:////tmp/x.db" and cfg.serve.min_running_engines == 1
    trinity.write_text(base)
    with pytest.raises(InputError, match="explorer.listen_address.*serve.admin_key"):
        load_config(trinity, [])
    assert load_config(trinity, ["serve.admin_key=k"]).serve.host == "0.0.0.0"
