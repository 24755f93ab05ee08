"""Explorer behaviour on the real stack, sharing one engine actor: eval schedule and resume."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from integration_settings import BASE
from mlflow import MlflowClient

import pipelines.control.explorer as explorer_module
from operators.sinks.reader import open_reader
from pipelines.control.state import ExplorerState
from pipelines.explore import explore
from schemas.config import DEFAULT_EVAL, load_config
from schemas.errors import InputError
from schemas.run_end import NothingLeft, finished_step


def history(summary, metric: str) -> list[int]:
    return [
        m.step for m in MlflowClient(summary.tracking_uri).get_metric_history(summary.mlflow_run_id, metric)
    ]


def test_eval_runs_at_startup_and_every_interval(engines, tmp_path):
    small = tmp_path / "eval.jsonl"
    small.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[:6]))
    eval_set = {"name": "arith_eval", "path": str(small), "repeat_times": 2}
    cfg = load_config(None, [*BASE, "buffer.total_steps=4", "explorer.eval_interval=2"])
    cfg.buffer.explorer_input.eval_tasksets = [eval_set]
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)
    assert sorted(history(summary, "eval/arith_eval/accuracy/mean")) == [0, 2, 4]
    assert sorted(history(summary, "eval/total_time")) == [0, 2, 4]
    assert sorted(history(summary, "eval/arith_eval/pass_at_2")) == [0, 2, 4]
    kept = pq.read_table(summary.run_dir / "eval" / "step_000002" / "arith_eval.parquet")
    assert kept.num_rows == 6 * 2  # the whole eval taskset, no dropped remainder
    assert set(kept.column("step").to_pylist()) == {2} and all(kept.column("is_eval").to_pylist())


def test_a_resume_that_changes_what_steps_hold_is_refused_before_anything_runs(engines, tmp_path):
    run_dir = tmp_path / "run"
    explore(load_config(None, [*BASE, "buffer.total_steps=2"]), run_dir, progress=False, engines=engines)
    before = sorted(p.name for p in (run_dir / "experiences").iterdir())
    changed = [
        *BASE,
        "buffer.total_steps=4",
        "buffer.batch_size=2",
        "buffer.explorer_input.taskset.rollout_args.seed=7",
    ]
    with pytest.raises(InputError) as refused:
        explore(load_config(None, changed), run_dir, progress=False, engines=engines)
    message = str(refused.value)
    assert "buffer.batch_size: 4 -> 2" in message and "rollout_args.seed: 0 -> 7" in message
    assert "total_steps" not in message  # a free key: allowed
    assert sorted(p.name for p in (run_dir / "experiences").iterdir()) == before  # nothing committed


def test_resume_continues_the_same_run_without_duplicates(engines, tmp_path):
    run_dir = tmp_path / "run"
    first = explore(
        load_config(None, [*BASE, "buffer.total_steps=3"]), run_dir, progress=False, engines=engines
    )
    assert ExplorerState.load(run_dir).latest_step == 3
    assert finished_step(run_dir) == 3  # a following reader stops here (tests/unit/test_experience_reader.py)
    second = explore(
        load_config(None, [*BASE, "buffer.total_steps=5"]), run_dir, progress=False, engines=engines
    )
    assert second.mlflow_run_id == first.mlflow_run_id
    for metric in ("rollout/reward/mean", "pipeline/experience_count"):
        assert history(second, metric) == sorted(set(history(second, metric))) == [1, 2, 3, 4, 5]
    table = pq.read_table(run_dir / "experiences")
    assert table.num_rows == 5 * 4 * 2 == len(set(table.column("uid").to_pylist()))
    state = json.loads((run_dir / "explorer_state.json").read_text())
    assert state["latest_step"] == 5 and state["task_index"] == 20
    assert finished_step(run_dir) == 5
    assert [step for step, _ in open_reader(run_dir).steps(follow=True, idle_timeout=600)] == [1, 2, 3, 4, 5]


def test_a_finished_run_given_again_starts_nothing(engines, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    cfg = load_config(None, [*BASE, "buffer.total_steps=1"])
    explore(cfg, run_dir, progress=False, engines=engines)

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run started Ray or an engine")

    monkeypatch.setattr(explorer_module, "init_ray", refuse)
    monkeypatch.setattr(explorer_module, "EngineFleet", refuse)
    again = explore(cfg, run_dir, progress=False)
    assert isinstance(again, NothingLeft) and "all its 1 steps" in again.render()


def test_skipped_bad_rows_are_counted_and_the_rest_explored(engines, tmp_path, caplog):
    lines = DEFAULT_EVAL.read_text().splitlines()[:8]
    taskset = tmp_path / "mixed.jsonl"
    taskset.write_text("\n".join([*lines[:4], "{broken", *lines[4:], '{"prompt": "no answer"}']) + "\n")
    overrides = [
        *BASE,
        "buffer.total_steps=2",
        f"buffer.explorer_input.taskset.path={taskset}",
        "buffer.explorer_input.taskset.on_bad_row=skip",
    ]
    summary = explore(load_config(None, overrides), tmp_path / "run", progress=False, engines=engines)
    assert pq.read_table(summary.run_dir / "experiences").num_rows == 8 * 2  # both steps full
    assert history(summary, "pipeline/skipped_rows/arith") == [0]
    assert "skipped 2 bad rows" in caplog.text


def test_split_repeats_commit_each_step_once(engines, tmp_path):
    cfg = load_config(None, [*BASE, "buffer.total_steps=2", "explorer.max_repeat_times_per_runner=1"])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)
    table = pq.read_table(summary.run_dir / "experiences")
    assert table.num_rows == 2 * 4 * 2 == len(set(table.column("uid").to_pylist()))
    assert sorted(set(table.column("run_id").to_pylist())) == [0, 1]


PLUGIN = """
from operators.workflows import MathWorkflow, register_reward, register_workflow


@register_reward("always_half")
def always_half(response: str, truth: str) -> dict[str, float]:
    return {"reward": 0.5, "half": 0.5}


@register_workflow("plugin_math")
class PluginMath(MathWorkflow):
    default_reward_fn = "always_half"
"""


def test_plugin_workflow_runs_in_the_ray_workers(engines, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "mine.py").write_text(PLUGIN)
    cfg = load_config(
        None,
        [*BASE, "buffer.total_steps=1", "buffer.explorer_input.taskset.default_workflow_type=plugin_math"],
    )
    cfg.plugin_dirs = [plugins]
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)
    table = pq.read_table(summary.run_dir / "experiences")
    assert table.num_rows == 4 * 2
    assert set(table.column("reward").to_pylist()) == {0.5}


def test_get_actor_returns_one_named_explorer_actor(engines):
    import ray

    from pipelines.explorer import Explorer

    cfg = load_config(None, [*BASE, "name=actor-check"])
    actor = Explorer.get_actor(cfg)
    assert ray.get(actor.is_alive.remote()) is True
    assert ray.get(Explorer.get_actor(cfg).is_alive.remote()) is True
    named = ray.get_actor("explorer/actor-check", namespace="rftflow")
    assert named._actor_id == actor._actor_id
    ray.kill(named)


def test_task_blocks_reach_the_rollout_stage_unsplit(engines):
    """Ray Data splits a read task's blocks until the read makes about 200 of them unless it is told how many
    it makes. Split, a step's rows came as blocks of a row or none, and the rollout stage, bundling them back
    into batches, ran one batch at a time: the engine saw a quarter of the requests the pool allows."""
    from operators.tasks.datasource import TasksetDatasource
    from operators.tasks.reader import plan_taskset
    from pipelines.control.plan import read

    cfg = load_config(None, [*BASE, "buffer.total_steps=3"])
    taskset = cfg.buffer.explorer_input.taskset
    plan = plan_taskset(taskset, cfg.buffer.batch_size, cfg.buffer.total_epochs, cfg.buffer.total_steps)
    tasks = read(TasksetDatasource(taskset, plan)).materialize()
    assert tasks.count() == 12 and tasks.num_blocks() <= 3  # the source's blocks, one a step (split: 200)
