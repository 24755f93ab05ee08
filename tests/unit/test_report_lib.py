"""`pipelines.report_lib` and `python -m pipelines.report` on hand-made tables and run dirs (no Ray, no
engine): the numbers behind each figure, the rollout browser, reading a run dir copied elsewhere (Parquet,
SQL, MLflow), the report's files and exit codes, and the notebooks as committed (no outputs)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from unit_factories import make_experience

from operators.sinks.parquet import ParquetSink
from operators.sinks.sql import SqlSink
from pipelines.bench import parse_args as bench_args
from pipelines.control.commands import invoked_command
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from pipelines.explore import parse_args as explore_args
from pipelines.report import main as report_main
from pipelines.report import make_report
from pipelines.report_lib import experiences, html, mlflow_store, plots, runs, summaries
from pipelines.report_lib import page as page_module
from pipelines.report_lib.page import INDEX, REPORT_DIR
from schemas.errors import InputError
from schemas.experience import experiences_to_table
from schemas.run_dir import MLARTIFACTS, failures_artifact

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TABLE = "the_run"  # the SQL table of the hand-made run (as the default name of a dir named `the-run`)


def experience_table(step_rewards: dict[int, list[float]]) -> pa.Table:
    """Experiences with the given rewards at each step; accuracy = reward, format 1 (absent in step 1)."""
    rows = []
    for step, rewards in step_rewards.items():
        for i, reward in enumerate(rewards):
            parts = {"accuracy": reward} if step == 1 else {"accuracy": reward, "format": 1.0}
            rows.append(
                make_experience(
                    f"t/e0/{step}-{i}", 0, step=step, reward=reward, reward_parts=parts, n_tokens=2 + i
                )
            )
    return experiences_to_table(rows)


def multi_turn_table() -> pa.Table:
    """One two-turn experience: tokens 2..3 of its response were inserted between the calls."""
    experience = make_experience(
        "t/e0/9",
        0,
        response_ids=[10, 11, 50, 51, 12, 13],
        logprobs=[-0.1] * 6,
        action_mask=[True, True, False, False, True, True],
        token_versions=[0, 0, -1, -1, 0, 0],
        inserted_spans=[(2, 4)],
        turns=2,
        prompt_text="<b>question</b>",
    )
    return experiences_to_table([experience])


def commit(sink, step: int, table: pa.Table) -> None:
    """Commit `table` as step `step` the way the driver does: one pending fragment, then `commit_step`."""
    pending = sink.root / "_pending" / f"step_{step:06d}"
    pending.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, pending / "part-0.parquet")
    sink.commit_step(step, {"part-0.parquet"})


def explore_run_dir(root: Path, storage: str = "parquet") -> tuple[Path, str]:
    """A run dir as an explorer leaves it: config.yaml, two committed steps, an eval, MLflow metrics, a
    failures table artifact and explorer_state.json. Returns it and its MLflow run id."""
    run_dir = root / "the-run"
    run_dir.mkdir(parents=True)
    buffer = {"storage_type": storage, "path": None, "name": None}
    config = {"name": "explore", "model": {"model_path": str(root / "no-model")}}
    taskset = {"name": "arith", "path": "train.jsonl", "repeat_times": 4}
    taskset["rollout_args"] = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "seed": 0}
    explorer_input = {"taskset": taskset, "eval_tasksets": [{"name": "arith_eval", "path": "eval.jsonl"}]}
    config["buffer"] = {"trainer_input": {"experience_buffer": buffer}, "explorer_input": explorer_input}
    (run_dir / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    if storage == "parquet":
        sink = ParquetSink(run_dir / "experiences")
    else:
        sink = SqlSink(run_dir / "experiences", f"sqlite:///{run_dir / 'experiences.db'}", TABLE)
    commit(sink, 1, experience_table({1: [0.0, 1.0]}))
    commit(sink, 2, experience_table({2: [1.0, 1.0, 0.0]}))
    sink.close()
    eval_dir = run_dir / "eval" / "step_000002"
    eval_dir.mkdir(parents=True)
    pq.write_table(experience_table({2: [1.0, 0.0]}), eval_dir / "arith_eval.parquet")
    monitor = MlflowMonitor(default_tracking_uri(run_dir), "rftflow", "the-run", run_dir / MLARTIFACTS)
    for step in (1, 2):
        metrics = {"rollout/tokens_per_s": 100.0 * step, "time/step": 2.0, "rollout/staleness/mean": 0.0}
        monitor.log_metrics(metrics, step)
    monitor.log_metrics({"eval/arith_eval/pass_at_2": 0.5, "eval/total_time": 1.5}, 2)
    failed = {"task_uid": ["t/e0/7"], "run_id_base": [0], "attempts": [3], "message": ["boom: <bad>"]}
    monitor.log_table(failed, failures_artifact(2))
    run_id = monitor.run_id
    monitor.close(ok=True)
    (run_dir / "explorer_state.json").write_text(json.dumps({"latest_step": 2, "mlflow_run_id": run_id}))
    return run_dir, run_id


def moved(run_dir: Path, to: Path) -> Path:
    """`run_dir` copied to `to` and the original removed: any absolute path recorded in it now points at
    nothing."""
    shutil.copytree(run_dir, to)
    shutil.rmtree(run_dir)
    return to


# -- summaries -------------------------------------------------------------------------------------------


def test_step_stats_give_each_steps_spread_and_leave_nulls_out():
    stats = summaries.step_stats([1, 1, 2, 2, 2, 3], [0.0, 1.0, 1.0, 1.0, None, None])
    assert stats.steps == [1, 2] and stats.count == [2, 2]
    assert stats.mean == [0.5, 1.0] and stats.std == [0.5, 0.0]
    assert stats.minimum == [0.0, 1.0] and stats.maximum == [1.0, 1.0]
    assert summaries.stats_rows(stats)[0]["p90"] == pytest.approx(0.9)


def test_reward_series_has_the_reward_and_each_part_from_the_map_column():
    curves = summaries.reward_series(experience_table({1: [0.0, 1.0], 2: [1.0, 1.0, 0.0]}))
    assert list(curves) == ["reward", "accuracy", "format"]
    assert curves["accuracy"].mean == pytest.approx([0.5, 2 / 3])
    assert curves["format"].steps == [2]  # step 1 has no format part: null, not 0


def test_response_pieces_cut_the_response_at_its_inserted_spans():
    assert summaries.response_pieces([1, 2, 3, 4, 5, 6], [[2, 4]]) == [
        (False, [1, 2]),
        (True, [3, 4]),
        (False, [5, 6]),
    ]
    assert summaries.response_pieces([1, 2, 3], [[0, 1], [2, 9]]) == [(True, [1]), (False, [2]), (True, [3])]
    assert summaries.response_pieces([1, 2], []) == [(False, [1, 2])]


def test_rollout_rows_spread_over_the_steps_and_are_the_same_each_time():
    table = experience_table({1: [0.0] * 10, 2: [1.0] * 10, 3: [1.0] * 10})
    rows = summaries.rollout_rows(table, limit=6)
    assert [r["step"] for r in rows] == [1, 1, 2, 2, 3, 3]
    assert rows == summaries.rollout_rows(table, limit=6)
    assert rows[0]["reward_parts"] == {"accuracy": 0.0}


def test_multi_turn_is_told_by_turns_or_spans_and_sampled_lengths_follow_the_mask():
    table = multi_turn_table()
    assert summaries.is_multi_turn(table) and not summaries.is_multi_turn(experience_table({1: [1.0]}))
    assert summaries.sampled_lengths(table) == [4]
    assert summaries.response_lengths(table).to_pylist() == [6]
    visible = [ax for ax in plots.response_length_figure(table).axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["response tokens", "sampled tokens (action_mask)"]


def test_figures_wrap_at_three_panels_and_give_png_bytes():
    figure = plots.reward_figure(experience_table({1: [0.0, 1.0], 2: [1.0]}))
    assert sum(ax.get_visible() for ax in figure.axes) == 3  # reward, accuracy, format
    assert plots.png_bytes(figure).startswith(b"\x89PNG")
    row = {"step": 1, "taskset": "a", "status": "ok"}
    wide = plots.bench_figure([{**row, **dict.fromkeys(plots.BENCH_METRICS, 1.0)}])
    assert len(wide.axes) == 6 and sum(ax.get_visible() for ax in wide.axes) == 5  # 2 rows of 3
    assert plots.throughput_figure({}) is None and plots.eval_figure(experience_table({}), {}) is None


def test_the_reward_band_stays_within_the_rewards_range():
    table = experience_table({1: [1.0, 1.0, 1.0, 0.0], 2: [0.0, 0.0, 0.0, 1.0]})  # mean ± std passes 1 and 0
    stats = summaries.reward_series(table)["reward"]
    low, high = plots.spread_band(stats)
    assert low == [pytest.approx(0.75 - 0.4330127), 0.0] and high == [1.0, pytest.approx(0.25 + 0.4330127)]
    band = plots.reward_figure(table).axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() >= 0.0 and band.max() <= 1.0


def test_panels_of_flat_zeros_are_left_out():
    still = experience_table({1: [1.0], 2: [0.0]})  # every experience on version 0
    assert plots.version_figure(still, {"rollout/staleness/mean": [(1, 0.0), (2, 0.0)]}) is None
    synced = experiences_to_table(
        [make_experience(f"t/e0/{s}", 0, step=s, reward=1.0, model_version=s - 1) for s in (1, 2)]
    )
    one = plots.version_figure(synced, {"rollout/staleness/mean": [(1, 0.0)]})
    assert [ax.get_title() for ax in one.axes if ax.get_visible()] == ["model_version of the experiences"]
    stale = plots.version_figure(still, {"rollout/staleness/max": [(2, 1.0)]})
    assert [ax.get_title() for ax in stale.axes if ax.get_visible()] == [
        "staleness (versions behind the trainer)"
    ]


def test_the_reward_heading_names_only_the_parts_drawn():
    assert page_module.reward_heading(experience_table({2: [1.0]})) == (
        "Reward and its parts (accuracy, format) per step"
    )
    plain = experiences_to_table([make_experience("t/e0/1", 0, step=1, reward=1.0, reward_parts={})])
    assert page_module.reward_heading(plain) == "Reward per step"


def test_the_recorded_command_masks_credentials(monkeypatch):
    argv = ["x.py", "--set", "monitor.api_key=abc123", "--set", "s.url=postgresql+psycopg://u:pw9@h/db"]
    monkeypatch.setattr("sys.argv", argv)
    command = invoked_command()
    assert "abc123" not in command and "pw9" not in command
    assert "monitor.api_key=***" in command and "postgresql+psycopg://u:***@h/db" in command


# -- html ------------------------------------------------------------------------------------------------


def test_the_rollout_browser_greys_inserted_spans_and_escapes_the_run_text():
    rows = summaries.rollout_rows(multi_turn_table())
    page = html.rollouts_html(rows, decode=lambda ids: "".join(f"<{i}>" for i in ids))
    assert '<span class="inserted"' in page and "&lt;50&gt;&lt;51&gt;" in page
    assert '<span class="sampled" title="sampled by the model">&lt;10&gt;&lt;11&gt;</span>' in page
    assert "&lt;b&gt;question&lt;/b&gt;" in page and "<b>question" not in page
    assert "2 turns" in page
    without_tokenizer = html.rollouts_html(rows)
    assert '<span class="inserted" title="inserted: not sampled, masked out of training">50 51 </span>' in (
        without_tokenizer
    )


def test_bench_table_shows_each_estimate_with_its_interval():
    row = {"step": 2, "checkpoint": "/x/global_step_2", "taskset": "arith", "k": 2, "status": "ok"}
    row.update({"accuracy": 0.5, "accuracy_ci_low": 0.25, "accuracy_ci_high": 0.75, "tokens_per_s": 99.6})
    table = html.bench_table_html([row])
    assert "0.5 [0.25, 0.75]" in table and "global_step_2" in table and "<td>100</td>" in table


# -- runs, experiences and MLflow from a run dir copied elsewhere ----------------------------------------


@pytest.mark.parametrize(
    "name, reason",
    [("missing", "no such run directory"), ("file", "not a directory"), ("", "not a run directory")],
)
def test_open_run_refuses_what_is_not_a_run_dir_naming_the_path(tmp_path, name, reason):
    (tmp_path / "file").write_text("not a run")
    path = tmp_path / name
    with pytest.raises(InputError) as refused:
        runs.open_run(path)
    assert str(refused.value).startswith(f"{path}: {reason}")


def test_a_notebook_in_notebooks_finds_a_run_given_from_the_checkouts_root(tmp_path, monkeypatch):
    """Jupyter runs a notebook in `notebooks/`; `runs/<name>`, as the run printed it, is under the root."""
    assert NOTEBOOKS.parent == runs.CHECKOUT  # the real checkout's root
    checkout = tmp_path / "checkout"  # a stand-in, so the test writes nothing into the real one
    (checkout / "notebooks").mkdir(parents=True)
    run_dir = checkout / "runs" / "the-run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("name: explore\n")  # enough to be an explore run dir
    monkeypatch.setattr(runs, "CHECKOUT", checkout)
    monkeypatch.chdir(checkout / "notebooks")
    run = runs.open_run("runs/the-run")  # what the notebooks call with their `run_dir`
    assert run.root == run_dir.resolve() and run.kind == runs.EXPLORE
    (checkout / "notebooks" / "runs" / "the-run").mkdir(parents=True)  # found from the cwd: taken as given
    with pytest.raises(InputError, match="not a run directory"):
        runs.open_run("runs/the-run")
    with pytest.raises(InputError, match="runs/no-such-run: no such run directory"):
        runs.open_run("runs/no-such-run")


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("parquet")
    run_dir, run_id = explore_run_dir(root / "original")
    return moved(run_dir, root / "elsewhere" / "renamed"), run_id


def test_a_copied_parquet_run_reads_its_steps_evals_metrics_and_failures(parquet_run):
    run_dir, run_id = parquet_run
    run = runs.open_run(run_dir)
    assert (run.kind, run.run_id, run.root) == (runs.EXPLORE, run_id, run_dir.resolve())
    table = experiences.read_experiences(run_dir)
    assert table.column("step").to_pylist() == [1, 1, 2, 2, 2]
    assert experiences.read_eval(run_dir).num_rows == 2 and experiences.eval_steps(run_dir) == [2]
    histories = mlflow_store.metric_histories(run)
    assert histories["rollout/tokens_per_s"] == [(1, 100.0), (2, 200.0)]
    assert mlflow_store.series(histories, "missing") == ([], [])
    assert mlflow_store.failures(run) == [
        {"step": 2, "task_uid": "t/e0/7", "run_id_base": 0, "attempts": 3, "message": "boom: <bad>"}
    ]
    assert runs.token_decoder(run_dir) is None  # the model is not on this machine: ids are shown


def test_a_copied_sql_run_finds_its_table_in_its_own_file(tmp_path):
    run_dir, _ = explore_run_dir(tmp_path / "original", storage="sql")
    copy = moved(run_dir, tmp_path / "elsewhere" / "another-name")  # the default table name would differ
    assert experiences.storage_type(copy) == "sql"
    assert experiences.sql_tables(experiences.sql_store_url(copy)) == [TABLE]
    assert experiences.read_experiences(copy).num_rows == 5
    log = experiences.sql_commit_log(copy)
    assert log.column("step").to_pylist() == [1, 2] and log.column("num_experiences").to_pylist() == [2, 3]
    plots.commit_log_figure(log)  # draws from the log's types


def test_a_run_dir_without_sql_says_so(parquet_run):
    with pytest.raises(InputError, match="no experiences.db"):
        experiences.sql_commit_log(parquet_run[0])


def test_bench_rows_parse_numbers_and_keep_a_failed_checkpoints_reason(tmp_path):
    with (tmp_path / "bench_results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(
            handle, ["step", "checkpoint", "taskset", "k", "status", "accuracy", "reason"]
        )
        writer.writeheader()
        writer.writerow(
            {"step": "2", "checkpoint": "c", "taskset": "a", "k": "2", "status": "ok", "accuracy": "0.5"}
        )
        writer.writerow({"step": "3", "checkpoint": "d", "status": "failed", "reason": "truncated"})
    ok, failed = runs.bench_rows(tmp_path)
    assert ok == {"step": 2, "checkpoint": "c", "taskset": "a", "k": 2, "status": "ok", "accuracy": 0.5}
    assert failed == {"step": 3, "checkpoint": "d", "status": "failed", "reason": "truncated"}
    assert runs.open_run(tmp_path).kind == runs.BENCH
    plots.bench_figure([ok, failed])


# -- the report ------------------------------------------------------------------------------------------


def test_the_report_of_a_copied_run_is_written_and_logged_into_the_copy(parquet_run):
    run_dir, run_id = parquet_run
    report = make_report(run_dir)
    names = sorted(p.name for p in report.folder.iterdir())
    # no versions.png: every experience is on version 0 and staleness is 0 (a run without weight sync)
    assert names == sorted([INDEX, "reward.png", "response_length.png", "throughput.png", "eval.png"])
    page = report.index.read_text()
    assert all(f'src="{name}"' in page for name in names if name.endswith(".png"))
    assert "boom: &lt;bad&gt;" in page and "Rollouts (a sample of 5)" in page
    assert page.count("<style>") == 1  # in the head; the fragments' own copies are for notebook cells
    assert "Model version" not in page and "Reward and its parts (accuracy, format) per step" in page
    logged = run_dir / MLARTIFACTS / run_id / "artifacts" / REPORT_DIR
    assert sorted(p.name for p in logged.iterdir()) == names


def test_the_facts_table_says_what_ran_how_long_and_with_what_command(parquet_run):
    run = runs.open_run(parquet_run[0])
    facts = page_module.explore_facts(run, experiences.read_experiences(run.root), [])
    assert facts["model"].endswith("no-model")
    assert facts["taskset"] == "arith (train.jsonl)" and facts["eval tasksets"] == "arith_eval (eval.jsonl)"
    assert facts["sampling"] == "temperature=0.7, top_p=1.0, top_k=-1, max_tokens=16, n=4"
    assert facts["wall time"].endswith(" s") and float(facts["wall time"][:-2]) >= 0
    assert facts["command"] == invoked_command()  # recorded when the MLflow run was made, in this process


def test_the_report_cli_prints_the_pages_path_once(tmp_path, capsys):
    run_dir, _ = explore_run_dir(tmp_path)
    assert report_main([str(run_dir), "--no-mlflow"]) == 0
    captured = capsys.readouterr()
    index = str(run_dir.resolve() / REPORT_DIR / INDEX)
    assert (captured.out + captured.err).count(index) == 1


def test_a_report_without_an_mlflow_run_is_written_and_not_logged(tmp_path, caplog):
    run_dir, _ = explore_run_dir(tmp_path)
    (run_dir / "explorer_state.json").unlink()
    report = make_report(run_dir)
    assert report.index.is_file()
    assert "not logged to MLflow" in caplog.text
    assert not list((run_dir / MLARTIFACTS).glob(f"*/artifacts/{REPORT_DIR}"))


@pytest.mark.parametrize("name", ["missing", "file"])
def test_the_report_cli_refuses_bad_input_with_exit_2_and_one_error_line(tmp_path, capsys, name):
    (tmp_path / "file").write_text("not a run")
    assert report_main([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / name}: ")


def test_the_report_cli_has_help_and_the_runs_have_a_report_flag(capsys):
    with pytest.raises(SystemExit) as done:
        report_main(["--help"])
    assert done.value.code == 0 and "RUN_DIR/report/index.html" in capsys.readouterr().out
    assert explore_args(["--report"]).report and not explore_args([]).report
    assert bench_args(["--report"]).report


# -- the notebooks as committed --------------------------------------------------------------------------


def notebook_files() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert [p.name for p in notebook_files()] == [
        "bench_compare.ipynb",
        "experiences_sql.ipynb",
        "explore_run.ipynb",
    ]


@pytest.mark.parametrize("path", notebook_files(), ids=lambda p: p.name)
def test_each_notebook_is_committed_without_outputs_and_takes_run_dir_as_its_parameter(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    dirty = [i for i, cell in enumerate(code) if cell.outputs or cell.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} hold outputs or execution counts; clear them"
    parameters = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1 and parameters[0].source.startswith("run_dir = ")


def test_the_taskset_figure_draws_each_tasksets_reward_and_the_selector_figures():
    from schemas.experience import experiences_to_table

    rows = [
        make_experience(f"{name}/e0/{step}", 0, step=step, taskset=name, reward=reward)
        for step in (1, 2)
        for name, reward in (("easy", 1.0), ("hard", 0.0))
    ]
    table = experiences_to_table(rows)
    histories = {
        "selector/hard/estimated_pass_rate": [(1, 0.5), (2, 0.4)],
        "selector/hard/experiences": [(1, 1)],
    }
    figure = plots.taskset_figure(table, histories)
    assert [ax.get_title() for ax in figure.axes] == ["reward per taskset", "selector figures"]
    assert [line.get_label() for line in figure.axes[1].lines] == ["hard/estimated_pass_rate"]
    single = experiences_to_table([make_experience("t/e0/0", 0)])
    assert plots.taskset_figure(single, {}) is None  # one file-order taskset: nothing to add
