"""Crash resume: SIGKILL the explore driver at a random moment, rerun it, and lose or repeat nothing.

The killed run is a real `python -m pipelines.explore` process with its own Ray and engine. The resume runs
in a process that never held the run's state: this one, on the session's shared engine, as a trainer's
restarted driver would (a second explore process per scenario cost its own Ray and engine start, about a
minute each on 2 cores, and checked nothing more). The uninterrupted run it is compared with uses the same
config and seed on the shared engine. With experience ops on, what survives depends on the sampled rewards,
so that run is checked against itself: every task of every step written whole or counted as dropped, once.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from integration_settings import BASE
from mlflow import MlflowClient
from ops_checks import FILTERED, OPS, check_whole_groups_with_grpo_advantages, committed, metric_by_step

from operators.sinks.parquet import ParquetSink
from pipelines.control.feed import task_feedback
from pipelines.control.schedule_checks import plan_training
from pipelines.control.state import ExplorerState
from pipelines.explore import explore
from schemas.config import DEFAULT_EVAL, load_config

STEPS, EVAL_INTERVAL = 10, 3
SEED = 20261202  # picks the kill moment; the same seed always picks the same one
ROOT = Path(__file__).resolve().parents[2]


def settings(eval_set: Path) -> list[str]:
    return [
        *BASE,
        f"buffer.total_steps={STEPS}",
        f"explorer.eval_interval={EVAL_INTERVAL}",
        f"buffer.explorer_input.eval_tasksets=[{{name: arith_eval, path: '{eval_set}', repeat_times: 1}}]",
    ]


def keys(run_dir: Path) -> list[tuple[str, int, int]]:
    """Every committed experience's exactly-once key, through the sink (old fragments read as segment 0)."""
    sink = ParquetSink(run_dir / "experiences")
    tables = [
        sink.read_step(step).select(["task_uid", "run_id", "segment"]) for step in sink.committed_steps()
    ]
    return [(r["task_uid"], r["run_id"], r["segment"]) for t in tables for r in t.to_pylist()]


def step_hashes(run_dir: Path) -> dict[str, str]:
    """Every committed file's digest: a resumed run must leave what was committed before the crash alone."""
    files = sorted((run_dir / "experiences").glob("step_*/*.parquet"))
    return {str(f.relative_to(run_dir)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


CONSOLE_NOISE = (  # what a default run printed before the console was quieted (issue 39)
    "streaming_executor.py",  # Ray Data's INFO lines
    "Progress bars disabled",  # Ray Data's warning
    "Token authentication is enabled",  # Ray's notice
    "NUMA binding",  # torch's C++ warning in vLLM's CPU worker
    "constructor arguments in the object store",  # Ray's core_worker.cc error for every Ray Data actor pool
    "Triton",  # vLLM's "Triton is installed, but doesn't include CPU backend", torch's "Triton not available"
    "Loading safetensors",  # vLLM's loading bar
)


def start_explore(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    command = [sys.executable, "-m", "pipelines.explore", "--config", str(config), "--run-dir", str(run_dir)]
    command += extra
    # its console goes to a file beside the run dir, not a pipe: a pipe read after the kill could wait on a
    # process the killed driver started that still holds the pipe open
    with open(console_log(run_dir), "wb") as log:
        return subprocess.Popen(
            [*command, "--no-progress"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )


def console_log(run_dir: Path) -> Path:
    return run_dir.with_name(f"{run_dir.name}.console.log")


def resume(config: Path, run_dir: Path, engines, plugins: Path | None = None, **options) -> None:
    """Resume the killed run from its config file, here on the shared engines, to its end."""
    cfg = load_config(config)
    cfg.plugin_dirs = [plugins.resolve()] if plugins else []  # as `--plugin-dir` gives them
    explore(cfg, run_dir, progress=False, engines=engines, **options)


def kill_at_random_moment(
    process: subprocess.Popen, run_dir: Path, rng: random.Random, steps: int = STEPS
) -> int:
    """SIGKILL once a random number of steps has committed, a random fraction of a second later, or sooner
    when two more steps commit first (steps of a fast run take well under that fraction: the kill must still
    leave steps for the resume).

    The driver is stopped (SIGSTOP) before it is killed: it is the process that commits, so the steps
    committed at the kill are the ones seen while it is stopped, however late this (possibly descheduled)
    watcher wakes up on a loaded machine. A run that committed its last step even so is reported as such.
    """
    target = rng.randint(1, max(1, steps - 3))
    sink = ParquetSink(run_dir / "experiences")
    deadline = time.monotonic() + 600
    while len(sink.committed_steps()) < target:
        assert process.poll() is None, console_log(run_dir).read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)
    kill_at = time.monotonic() + rng.uniform(0.0, 0.4)
    while time.monotonic() < kill_at and len(sink.committed_steps()) < min(target + 2, steps - 2):
        time.sleep(0.005)
    process.send_signal(signal.SIGSTOP)
    committed = len(sink.committed_steps())
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    output = console_log(run_dir).read_text(errors="replace")
    noise = [line for line in output.splitlines() if any(known in line for known in CONSOLE_NOISE)]
    assert not noise, noise  # the libraries' start-up lines stay off a default console (docs/running.md)
    assert committed < steps, f"the run committed all {steps} steps before the kill: nothing to resume"
    return target


def metric_steps(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    names = client.get_run(run_id).data.metrics
    return {name: [m.step for m in client.get_metric_history(run_id, name)] for name in names}


@pytest.mark.timeout(900)  # an explore process starting an engine: minutes on 2 cores
def test_sigkill_at_a_random_moment_then_resume_gives_the_uninterrupted_keys(engines, tmp_path):
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[:4]))
    cfg = load_config(None, settings(eval_set))
    reference = explore(cfg, tmp_path / "uninterrupted", progress=False, engines=engines)
    expected = keys(reference.run_dir)
    assert len(expected) == len(set(expected)) == STEPS * 4 * 2

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "crashed"
    killed_after = kill_at_random_moment(start_explore(config, run_dir), run_dir, random.Random(SEED))
    committed = ParquetSink(run_dir / "experiences").committed_steps()
    assert killed_after <= len(committed) < STEPS  # killed mid-run, with work left to do
    before = step_hashes(run_dir)
    run_id = ExplorerState.load(run_dir).mlflow_run_id

    resume(config, run_dir, engines)

    got = keys(run_dir)
    assert len(got) == len(set(got))  # nothing twice
    assert sorted(got) == sorted(expected)  # nothing missing, nothing extra
    after = step_hashes(run_dir)
    assert {k: after[k] for k in before} == before  # committed steps untouched by the resume
    assert not (run_dir / "experiences" / "_pending").exists()

    state = ExplorerState.load(run_dir)
    assert state.mlflow_run_id == run_id and state.latest_step == STEPS  # the same MLflow run, continued
    client = MlflowClient(f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    steps = metric_steps(client, run_id)
    for name, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{name} logged twice at a step: {sorted(logged)}"
    assert sorted(steps["pipeline/experience_count"]) == list(range(1, STEPS + 1))
    assert sorted(steps["eval/total_time"]) == list(range(0, STEPS + 1, EVAL_INTERVAL))
    assert client.get_run(run_id).info.status == "FINISHED"


AGENT_PLUGINS = ROOT / "tests" / "agent_plugins"
AGENT_STEPS = 8  # steps are quick (agent runs are short): enough left to kill the run mid-way


@pytest.mark.timeout(900)  # an explore process starting an engine, then a resume here
def test_split_agent_trajectories_are_written_exactly_once_across_a_crash_resume(engines, tmp_path):
    """An agent that edits its history splits every run into segments; their (task_uid, run_id, segment)
    keys survive a SIGKILL and a resume exactly as an uninterrupted run writes them."""
    cfg = load_config(
        None,
        [
            *BASE,
            f"buffer.total_steps={AGENT_STEPS}",
            "buffer.explorer_input.taskset.default_workflow_type=test_openai_agent",
            "buffer.explorer_input.taskset.workflow_args={edit_history: true}",
        ],
    )
    cfg.plugin_dirs = [AGENT_PLUGINS]
    reference = explore(cfg, tmp_path / "uninterrupted", progress=False, engines=engines)
    expected = keys(reference.run_dir)
    assert len(expected) == len(set(expected)) and {s for _, _, s in expected} >= {0, 1}  # split runs

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**cfg.model_dump(mode="json"), "plugin_dirs": []}))
    run_dir = tmp_path / "crashed"
    plugin = ("--plugin-dir", str(AGENT_PLUGINS))
    kill_at_random_moment(start_explore(config, run_dir, *plugin), run_dir, random.Random(SEED), AGENT_STEPS)
    assert len(ParquetSink(run_dir / "experiences").committed_steps()) < AGENT_STEPS
    resume(config, run_dir, engines, AGENT_PLUGINS)
    got = keys(run_dir)
    assert len(got) == len(set(got)) and sorted(got) == sorted(expected)


@pytest.mark.timeout(900)  # an explore process starting an engine, then a resume here
def test_over_rollout_accounts_for_every_task_once_across_a_crash_resume(engines, tmp_path):
    """With over-rollout, each step commits once half its tasks are done; the rest are skipped. Across a
    SIGKILL and a resume, no key is written twice, every committed task has all its samples, no task is in
    two steps, and each step's committed, skipped and failed tasks add up to the step's tasks."""
    cfg = load_config(None, [*BASE, f"buffer.total_steps={STEPS}", "explorer.over_rollout.ratio=0.5"])
    run_dir = crash_and_resume(cfg, tmp_path, engines)
    steps_of = whole_tasks_once(run_dir)
    skipped, failed = logged(run_dir, "rollout/skipped_tasks"), logged(run_dir, "rollout/failed_tasks")
    assert sum(skipped.values()) > 0  # over-rollout really cut tasks
    for step, cut in skipped.items():  # steps committed just before the kill are relogged without records
        committed = {uid for uid, s in steps_of.items() if step in s}
        assert len(committed) + cut + failed[step] == cfg.buffer.batch_size, f"step {step}"


@pytest.mark.timeout(900)  # an explore process starting an engine, then a resume here
def test_over_rollout_recycle_accounts_for_every_task_once_across_a_crash_resume(engines, tmp_path):
    """With `recycle`, the cut tasks go on into the next step. Across a SIGKILL and a resume, nothing is
    written twice or in two steps, groups are whole, and each step's committed, skipped, failed and moved-on
    tasks add up to its batch plus what the step before moved into it, less what the crash lost (counted)."""
    cut = ["explorer.over_rollout.ratio=0.5", "explorer.over_rollout.recycle=true"]
    cfg = load_config(None, [*BASE, f"buffer.total_steps={STEPS}", *cut])
    run_dir = crash_and_resume(cfg, tmp_path, engines)
    steps_of = whole_tasks_once(run_dir)
    moved, lost = logged(run_dir, "rollout/recycled_tasks"), logged(run_dir, "rollout/recycle_lost")
    skipped, failed = logged(run_dir, "rollout/skipped_tasks"), logged(run_dir, "rollout/failed_tasks")
    assert sum(moved.values()) > 0  # over-rollout really moved tasks on
    assert moved.get(STEPS, 0) == 0  # the last step has no next step: its tail is skipped
    checked = 0
    for step in moved:  # steps committed just before the kill are relogged without records
        if step > 1 and step - 1 not in moved:
            continue  # what the step before moved in is not known
        committed = {uid for uid, s in steps_of.items() if step in s}
        came_in = moved.get(step - 1, 0) - lost.get(step, 0)
        total = len(committed) + skipped[step] + failed[step] + moved[step]
        assert total == cfg.buffer.batch_size + came_in, f"step {step}"
        checked += 1
    assert checked >= STEPS // 2


def crash_and_resume(cfg, tmp_path: Path, engines) -> Path:
    """Run `cfg` in an explore process, SIGKILL it at a seeded random moment, resume it to the end."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "crashed"
    kill_at_random_moment(start_explore(config, run_dir), run_dir, random.Random(SEED))
    assert len(ParquetSink(run_dir / "experiences").committed_steps()) < STEPS
    resume(config, run_dir, engines)
    return run_dir


def whole_tasks_once(run_dir: Path) -> dict[str, set[int]]:
    """Each committed task's step; asserts that no key is written twice, that each committed task has all
    its samples (a cut task left nothing behind), and that no task is in two steps."""
    got = keys(run_dir)
    assert len(got) == len(set(got))  # nothing twice
    sink = ParquetSink(run_dir / "experiences")
    steps_of: dict[str, set[int]] = {}
    for step in sink.committed_steps():
        table = sink.read_step(step).select(["task_uid", "run_id"]).to_pylist()
        runs: dict[str, set[int]] = {}
        for row in table:
            runs.setdefault(row["task_uid"], set()).add(row["run_id"])
            steps_of.setdefault(row["task_uid"], set()).add(step)
        assert all(ids == {0, 1} for ids in runs.values())  # whole groups only
    assert all(len(s) == 1 for s in steps_of.values())  # no task in two steps
    return steps_of


def logged(run_dir: Path, name: str) -> dict[int, float]:
    """A metric of the run in `run_dir`, by step."""
    client = MlflowClient(f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    run_id = ExplorerState.load(run_dir).mlflow_run_id
    return {m.step: m.value for m in client.get_metric_history(run_id, name)}


OPS_STEPS, OPS_REPEATS, BATCH = 8, 4, 4  # BATCH: as in BASE


@pytest.mark.timeout(900)  # an explore process starting an engine, then a resume here
def test_with_experience_ops_a_crash_resume_writes_each_group_whole_once_and_counts_its_drops_once(
    engines, tmp_path
):
    cfg = load_config(
        None,
        [
            *BASE,
            f"buffer.total_steps={OPS_STEPS}",
            f"buffer.explorer_input.taskset.repeat_times={OPS_REPEATS}",
            "explorer.max_repeat_times_per_runner=1",  # each sample a sub-run of its own
            f"buffer.explorer_input.experience_ops={OPS}",
        ],
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "crashed"
    kill_at_random_moment(start_explore(config, run_dir), run_dir, random.Random(SEED), OPS_STEPS)
    assert len(ParquetSink(run_dir / "experiences").committed_steps()) < OPS_STEPS
    before = step_hashes(run_dir)
    resume(config, run_dir, engines)
    after = step_hashes(run_dir)
    assert {k: after[k] for k in before} == before  # committed steps untouched by the resume

    steps = committed(run_dir)
    assert sorted(steps) == list(range(1, OPS_STEPS + 1))
    got = keys(run_dir)
    assert len(got) == len(set(got))  # nothing twice
    uri = f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    run_id = ExplorerState.load(run_dir).mlflow_run_id
    written = metric_by_step(uri, run_id, "pipeline/experience_count")
    filtered = metric_by_step(uri, run_id, FILTERED)
    assert sorted(written) == list(range(1, OPS_STEPS + 1))
    # A step committed in the instant before the kill is logged by the resume from the store, which cannot
    # know what the ops dropped: at most that one step lacks the count.
    assert len(set(written) - set(filtered)) <= 1
    assert set(metric_by_step(uri, run_id, "rollout/failed_tasks").values()) == {0.0}
    for step, table in steps.items():
        tasks = check_whole_groups_with_grpo_advantages(table, OPS_REPEATS)  # whole groups, once each
        assert written[step] == len(table)
        if step in filtered:  # every sample of the step's tasks written or counted as dropped, once
            assert filtered[step] + len(table) == BATCH * OPS_REPEATS
            assert tasks + filtered[step] / OPS_REPEATS == BATCH


PARTIAL_STEPS, SHORT, LONG = 8, 8, 200
LENGTH_PLUGINS = ROOT / "tests" / "length_plugins"


@pytest.mark.timeout(
    900
)  # an explore process starting an engine, then a resume here; each with a reference trainer
def test_partial_rollout_commits_each_task_once_across_a_crash_resume(engines, tmp_path):
    """A closed loop with partial rollout (each sync cuts the next step's generations, which go on under the
    new weights), SIGKILLed and resumed: every task committed once, in one step, whole; every continuation
    stamped token by token with versions that only rise, counted by its oldest."""
    cfg = load_config(
        None,
        [
            *BASE,
            f"buffer.total_steps={PARTIAL_STEPS}",
            "buffer.explorer_input.taskset.default_workflow_type=alternating_lengths",
            f"buffer.explorer_input.taskset.workflow_args={{short: {SHORT}, long: {LONG}}}",
            "synchronizer.sync_method=checkpoint",
            "synchronizer.max_staleness=2",
            "synchronizer.sync_timeout=120",
            "synchronizer.partial_rollout=true",
        ],
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "crashed"
    extra = ("--with-trainer", "--plugin-dir", str(LENGTH_PLUGINS))
    kill_at_random_moment(start_explore(config, run_dir, *extra), run_dir, random.Random(SEED), PARTIAL_STEPS)
    assert len(ParquetSink(run_dir / "experiences").committed_steps()) < PARTIAL_STEPS
    resume(config, run_dir, engines, LENGTH_PLUGINS, with_trainer=True)

    client = MlflowClient(f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    run_id = ExplorerState.load(run_dir).mlflow_run_id
    dropped = sum(m.value for m in client.get_metric_history(run_id, "rollout/stale_dropped"))
    got = keys(run_dir)
    # every task's two samples once: committed, or dropped as too stale at commit (a step sampled before the
    # resume's first sync can be, when the trainer went on training meanwhile)
    assert len(got) == len(set(got)) and len(got) + dropped == PARTIAL_STEPS * BATCH * 2
    sink = ParquetSink(run_dir / "experiences")
    steps_of: dict[str, set[int]] = {}
    rows = []
    for step in sink.committed_steps():
        for row in sink.read_step(step).to_pylist():
            steps_of.setdefault(row["task_uid"], set()).add(step)
            rows.append(row)
    assert all(len(s) == 1 for s in steps_of.values())  # no task in two steps
    for row in rows:
        versions = row["token_versions"]
        assert versions == sorted(versions) and row["model_version"] == versions[0]
        assert len(versions) == len(row["response_ids"]) == (LONG if row["step"] % 2 == 0 else SHORT)
    assert any(len(set(row["token_versions"])) > 1 for row in rows)  # some sampled across a sync
    staleness = client.get_metric_history(run_id, "rollout/staleness/max")
    assert max(m.value for m in staleness) <= 2


CURRICULUM = ROOT / "pipelines" / "curriculum.yaml"


def drawn_by_step(run_dir: Path) -> dict[int, list[tuple[str, str, str]]]:
    """(taskset, task uid, reference answer) of each committed task, by step, in a stable order."""
    sink = ParquetSink(run_dir / "experiences")
    out = {}
    for step in sink.committed_steps():
        rows = sink.read_step(step).select(["taskset", "task_uid", "truth"]).to_pylist()
        out[step] = sorted({(r["taskset"], r["task_uid"], r["truth"]) for r in rows})
    return out


def replayed_by_step(cfg, run_dir: Path) -> dict[int, list[tuple[str, str, str]]]:
    """What a run that never crashed draws, given the rewards the run in `run_dir` committed: the scheduler
    driven step by step from a fresh start, each committed step's feedback given as it commits."""
    _, tasks = plan_training(cfg)
    sink, picked, out = ParquetSink(run_dir / "experiences"), {}, {}
    for step in range(1, STEPS + 1):
        table, picks = tasks.step_table(step)
        picked.update(zip(table.column("task_uid").to_pylist(), picks, strict=True))
        columns = [table.column(name).to_pylist() for name in ("taskset", "task_uid", "truth")]
        out[step] = sorted(zip(*columns, strict=True))
        tasks.scheduler.feedback(step, task_feedback(sink.read_step(step), picked))
    return out


@pytest.mark.timeout(900)  # an explore process starting an engine, then a resume here
def test_a_difficulty_curriculum_over_two_tasksets_resumes_to_the_uninterrupted_sequence(engines, tmp_path):
    """SIGKILL a run of pipelines/curriculum.yaml (two tasksets, `difficulty_based`) mid-way and resume it:
    every step holds the (taskset, task) an uninterrupted run draws given the same committed rewards, which
    only holds if the selector's state (its estimates included) and the feedback lag resumed exactly."""
    base = [s for s in BASE if "explorer_input.taskset." not in s]
    cfg = load_config(CURRICULUM, [*base, f"buffer.total_steps={STEPS}", "buffer.batch_size=4"])
    run_dir = crash_and_resume(cfg, tmp_path, engines)
    got = drawn_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == replayed_by_step(cfg, run_dir)
    assert {name for step in got.values() for name, _, _ in step} == {"graded", "arith"}
    state = ExplorerState.load(run_dir)
    assert state.selector_state["next_step"] > STEPS and state.selector_state["fed"] == STEPS
    assert (
        len(state.selector_state["selectors"][0]["alphas"]) == 400
    )  # the estimates are saved, not only a count
    # Each step's selector figures are logged once it commits; a SIGKILL that lands between a step's commit
    # and its metrics loses that one step's figures (the selector's state itself is exact, checked above).
    logged_steps = logged(run_dir, "selector/graded/mean_pass_rate")
    assert len(set(logged_steps)) == len(logged_steps) and set(logged_steps) <= set(range(1, STEPS + 1))
    assert len(logged_steps) >= STEPS - 1
    assert sorted(logged(run_dir, "rollout/graded/reward/mean"))  # logged per taskset
