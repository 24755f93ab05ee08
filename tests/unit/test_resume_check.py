"""The resume check on plain configs: which keys are identity, which are free, and what is refused."""

from __future__ import annotations

import pytest
import yaml

from pipelines.control.resume_check import changed_keys, check_resume, is_free
from schemas.config import load_config
from schemas.errors import InputError
from schemas.run_dir import CONFIG


def save(run_dir, cfg) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


@pytest.mark.parametrize(
    ("key", "free"),
    [
        ("buffer.total_steps", True),
        ("explorer.eval_interval", True),
        ("explorer.max_timeout", True),
        ("explorer.rollout_model.engine_num", True),
        ("monitor.sample_rollouts", True),
        ("buffer.batch_size", False),
        ("buffer.explorer_input.taskset.repeat_times", False),
        ("buffer.explorer_input.taskset.rollout_args.seed", False),
        ("buffer.explorer_input.taskset.workflow_args.anything", False),
        ("model.model_path", False),
        ("no.such.key", False),  # unmarked counts as identity
    ],
)
def test_the_schema_marks_each_key(key, free):
    assert is_free(key) is free


def test_a_run_dir_without_a_saved_config_has_nothing_to_compare(tmp_path):
    check_resume(load_config(None, ["buffer.batch_size=2"]), tmp_path)


def test_identity_changes_are_refused_naming_each_key_and_both_values(tmp_path):
    save(tmp_path, load_config(None, []))
    changed = load_config(None, ["buffer.batch_size=2", "buffer.explorer_input.taskset.repeat_times=3"])
    with pytest.raises(InputError) as refused:
        check_resume(changed, tmp_path)
    message = str(refused.value)
    assert str(tmp_path / CONFIG) in message
    assert "buffer.batch_size: 8 -> 2" in message and "taskset.repeat_times: 4 -> 3" in message


def test_free_changes_are_allowed_and_logged(tmp_path, caplog):
    save(tmp_path, load_config(None, []))
    caplog.set_level("INFO", logger="pipelines")
    check_resume(load_config(None, ["buffer.total_steps=9", "explorer.eval_interval=3"]), tmp_path)
    assert "buffer.total_steps changed from None to 9" in caplog.text
    assert [key for key, _, _ in changed_keys(load_config(None, []), load_config(None, []))] == []


def test_a_corrupt_saved_config_is_a_located_error(tmp_path):
    (tmp_path / CONFIG).write_text("buffer: [unclosed")
    with pytest.raises(InputError, match="saved config is unreadable"):
        check_resume(load_config(None, []), tmp_path)
