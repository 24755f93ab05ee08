"""The experience-ops stage on result tables (no Ray): whole groups however repeats were split, counts per
sub-run carried by the records into the committer exactly once, the op contract, config and plugin checks."""

from __future__ import annotations

import pyarrow as pa
import pytest
from unit_factories import make_experience

from operators.ops.stage import ExperienceOpError, ExperienceOps
from operators.rollout.plugins import load_plugins
from operators.sinks.parquet import ParquetSink, write_fragments
from operators.tasks.reader import TasksetPlan
from pipelines.control.checks import check_experience_ops
from pipelines.control.metrics import filtered_metrics
from pipelines.control.steps import StepCommitter
from schemas.config import load_config
from schemas.errors import InputError
from schemas.status import Status, flatten_experiences, result_row, results_to_table

REWARDS = {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0], "c": [1.0, 0.5, 0.0, 0.5]}
CHAIN = [
    {"name": "reward_filter", "args": {"min_reward": 0.25}},
    {"name": "grpo_advantage"},
    {"name": "pass_rate"},
]


def sub_run(task: str, base: int, size: int, ok: bool = True, step: int = 1) -> dict:
    """One sub-run's result row with runs `base .. base + size - 1` of `task` (none if it failed)."""
    runs = range(base, base + size) if ok else []
    experiences = [make_experience(task, r, step=step, reward=REWARDS[task][r]) for r in runs]
    status = Status(ok=ok, message=None if ok else "boom")
    common = {"taskset": "t", "step": step, "is_eval": False, "task_run_time": 0.1}
    return result_row(
        task_uid=task, run_id_base=base, repeat_times=size, status=status, experiences=experiences, **common
    )


def whole(task: str) -> list[dict]:
    return [sub_run(task, 0, 4)]


def split(task: str) -> list[dict]:  # max_repeat_times_per_runner 2, and sub-runs reported out of order
    return [sub_run(task, 2, 2), sub_run(task, 0, 2)]


def by_key(results: pa.Table) -> dict[tuple, dict]:
    rows = flatten_experiences(results).to_pylist()
    return {(r["task_uid"], r["run_id"], r["segment"]): r for r in rows}


def test_split_repeats_give_exactly_what_one_runner_gives():
    ops = ExperienceOps(CHAIN)
    one = ops.apply_to_results(results_to_table([*whole("a"), *whole("b"), *whole("c")]))
    interleaved = [*split("a")[:1], *split("c")[:1], *whole("b"), *split("a")[1:], *split("c")[1:]]
    many = ops.apply_to_results(results_to_table(interleaved))
    assert by_key(one) == by_key(many)
    kept = by_key(many)
    assert sorted(kept) == [("a", 0, 0), ("a", 3, 0), ("c", 0, 0), ("c", 1, 0), ("c", 3, 0)]
    # after the filter a is [1, 1] (flat: 0) and c is [1, .5, .5]: mean 2/3, sample std sqrt(1/12)
    assert kept[("a", 0, 0)]["advantage"] == 0.0
    assert kept[("c", 0, 0)]["advantage"] == pytest.approx((1 / 3) / (1 / 12) ** 0.5, abs=1e-5)
    assert kept[("c", 1, 0)]["advantage"] == pytest.approx(-(1 / 6) / (1 / 12) ** 0.5, abs=1e-5)


def test_each_sub_run_record_counts_what_each_op_dropped_of_its_own_runs():
    out = ExperienceOps(CHAIN).apply_to_results(results_to_table([*split("a"), *whole("b")]))
    counts = [dict(f) for f in out.column("filtered").to_pylist()]
    zero = {"grpo_advantage": 0, "pass_rate": 0}
    # a: runs 1 and 2 (rewards 0) go, one in each sub-run; b: all four
    assert counts == [
        {"reward_filter": 1, **zero},
        {"reward_filter": 1, **zero},
        {"reward_filter": 4, **zero},
    ]
    kept = [[e["run_id"] for e in row] for row in out.column("experiences").to_pylist()]
    assert kept == [[3], [0], []]


def test_failed_sub_runs_are_missing_samples_and_a_lone_survivor_gets_zero():
    rows = [sub_run("a", 0, 2, ok=False), sub_run("a", 2, 1), sub_run("a", 3, 1, ok=False)]
    rows += [sub_run("c", 0, 2), sub_run("c", 2, 2, ok=False)]
    out = ExperienceOps([{"name": "grpo_advantage"}, {"name": "pass_rate"}]).apply_to_results(
        results_to_table(rows)
    )
    kept = by_key(out)
    assert kept[("a", 2, 0)]["advantage"] == 0.0  # a group of one
    assert '"pass_rate_runs": 1' in kept[("a", 2, 0)]["info"]
    c = 0.25 / 0.125**0.5  # c's finished runs: [1, 0.5], sample std sqrt(0.125)
    assert [kept[("c", r, 0)]["advantage"] for r in (0, 1)] == pytest.approx([c, -c], abs=1e-5)
    assert out.column("ok").to_pylist() == [False, True, False, True, False]  # statuses untouched


def test_records_carry_the_counts_and_a_fully_filtered_sub_run_names_no_fragment(tmp_path):
    results = ExperienceOps(CHAIN).apply_to_results(results_to_table([*split("a"), *whole("b")]))
    records = write_fragments(results, str(tmp_path))
    assert records.column("num_experiences").to_pylist() == [1, 1, 0]
    fragments = records.column("fragment").to_pylist()
    assert fragments[0] == fragments[1] is not None and fragments[2] is None
    assert filtered_metrics(records) == {
        "rollout/filtered/reward_filter": 6.0,
        "rollout/filtered/grpo_advantage": 0.0,
        "rollout/filtered/pass_rate": 0.0,
    }
    plain = write_fragments(results_to_table(whole("a")), str(tmp_path))  # no ops: an empty map
    assert plain.column("filtered").to_pylist() == [[]] and filtered_metrics(plain) == {}


def test_the_committer_commits_filtered_steps_once_and_counts_a_retried_batch_once(tmp_path):
    plan = TasksetPlan(files=(("tasks.jsonl", 3),), batch_size=3, total_epochs=1, total_steps=None)
    sink = ParquetSink(tmp_path / "experiences")
    committer = StepCommitter(plan, sink, rows_per_task=2)
    ops = ExperienceOps(CHAIN)
    batch = [*split("a"), *split("b"), *split("c")]

    def report(rows: list[dict]) -> list:
        return list(
            committer.add(write_fragments(ops.apply_to_results(results_to_table(rows)), str(sink.root)))
        )

    assert report(batch[:4]) == []  # a and b: b entirely filtered, yet reported, so not missing
    assert report(batch[:4]) == []  # the same batch retried: its records are repeats
    (step,) = report(batch[4:])
    assert committer.repeats == 4
    assert sorted(step.experiences.column("uid").to_pylist()) == ["a/0", "a/3", "c/0", "c/1", "c/3"]
    assert filtered_metrics(step.records)["rollout/filtered/reward_filter"] == 7.0  # 2 + 4 + 1, once
    assert sink.committed_steps() == [1] and len(list((sink.root / "step_000001").iterdir())) == 2


class AddsRows:
    def __call__(self, experiences: pa.Table) -> pa.Table:
        return pa.concat_tables([experiences, experiences])


class Raises:
    def __call__(self, experiences: pa.Table) -> pa.Table:
        raise ZeroDivisionError("oops")


class ReturnsList:
    def __call__(self, experiences: pa.Table) -> list:
        return experiences.to_pylist()


@pytest.mark.parametrize(
    ("op", "message"),
    [(AddsRows(), "never add rows"), (Raises(), "ZeroDivisionError: oops"), (ReturnsList(), "not a pyarrow")],
)
def test_an_op_breaking_the_contract_is_named(op, message):
    ops = ExperienceOps([{"name": "pass_rate"}])
    ops.chain.append(("mine", op))
    with pytest.raises(ExperienceOpError, match=message) as info:
        ops.apply_to_results(results_to_table(whole("a")))
    assert "experience op 'mine' (experience_ops.1)" in str(info.value)


@pytest.mark.parametrize(
    ("op", "field", "fragment"),
    [
        ("{name: reward_filter, args: {min_reward: high}}", "0.args.min_reward", "valid number"),
        ("{name: reward_filter, args: {}}", "0.args", "give min_reward, max_reward or both"),
        ("{name: reward_std_filter, args: {treshold: 0.1}}", "0.args.treshold", "Extra inputs"),
        ("{name: reward_shaping, args: {format_bonus: 1}}", "0.args", "needs a format_pattern"),
        ("{name: reward_shaping, args: {format_pattern: '(', format_bonus: 1}}", "0.args", "regular expr"),
        ("{name: grpo_advantage, args: {eps: -1}}", "0.args.eps", "greater than 0"),
        ("{args: {}}", "0.name", "Field required"),
    ],
)
def test_builtin_op_arguments_are_checked_when_the_config_loads(op, field, fragment):
    with pytest.raises(InputError) as info:
        load_config(None, [f"buffer.explorer_input.experience_ops=[{op}]"])
    assert info.value.field == f"buffer.explorer_input.experience_ops.{field}"
    assert fragment in str(info.value)


def test_an_unknown_op_is_refused_before_anything_starts():
    cfg = load_config(None, ["buffer.explorer_input.experience_ops=[{name: grpo_advantage}, {name: nope}]"])
    with pytest.raises(InputError) as info:
        check_experience_ops(cfg)
    assert info.value.field == "buffer.explorer_input.experience_ops.1.name"
    assert "unknown experience op 'nope'" in str(info.value) and "grpo_advantage" in str(info.value)


PLUGIN_OP = """
import pyarrow.compute as pc
from operators.workflows import ExperienceOpBase, OpArgs, register_op


@register_op("NAME")
class DropShort(ExperienceOpBase):
    class Args(OpArgs):
        min_tokens: int = 1

    def __call__(self, experiences):
        lengths = pc.list_value_length(experiences.column("response_ids"))
        return experiences.filter(pc.greater_equal(lengths, self.args.min_tokens))
"""


def test_a_plugin_registers_an_op_whose_arguments_are_checked(tmp_path):
    (tmp_path / "drop_short.py").write_text(PLUGIN_OP.replace("NAME", "test_drop_short"))
    ops = "[{name: test_drop_short, args: {min_tokens: 4}}]"
    cfg = load_config(None, [f"buffer.explorer_input.experience_ops={ops}"])
    cfg.plugin_dirs = [tmp_path]
    load_plugins(tmp_path)
    check_experience_ops(cfg)
    rows = [sub_run("a", 0, 4)]
    rows[0]["experiences"][1]["response_ids"] += [7]
    rows[0]["experiences"][1]["logprobs"] += [-1.0]
    rows[0]["experiences"][1]["action_mask"] += [True]
    rows[0]["experiences"][1]["token_versions"] += [0]
    stage = ExperienceOps([{"name": "test_drop_short", "args": {"min_tokens": 4}}])
    out = stage.apply_to_results(results_to_table(rows))
    assert [e["run_id"] for e in out.column("experiences").to_pylist()[0]] == [1]
    assert out.column("filtered").to_pylist() == [[("test_drop_short", 3)]]
    bad = load_config(
        None, ["buffer.explorer_input.experience_ops=[{name: test_drop_short, args: {min: 4}}]"]
    )
    with pytest.raises(InputError) as info:
        check_experience_ops(bad)
    assert info.value.field == "buffer.explorer_input.experience_ops.0.args.min"


def test_a_plugin_op_reusing_a_builtin_name_is_named(tmp_path):
    (tmp_path / "clash_op.py").write_text(PLUGIN_OP.replace("NAME", "grpo_advantage"))
    with pytest.raises(ImportError, match="clash_op.py.*'grpo_advantage' is already registered"):
        load_plugins(tmp_path)
