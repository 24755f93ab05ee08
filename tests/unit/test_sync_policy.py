"""The sync decision for the three styles, as a table of cases."""

import json

import pytest

from pipelines.control.sync_policy import TrainerStatus, read_trainer_status, sync_due

READY = TrainerStatus("require_sync", version=3)

CASES = [
    # style, step, interval, offset, last_sync_step, model_version, trainer, expected
    ("fixed", 1, 1, 0, 0, 0, None, True),
    ("fixed", 1, 2, 0, 0, 0, None, False),
    ("fixed", 2, 2, 0, 0, 0, None, True),
    ("fixed", 1, 1, 1, 0, 0, None, False),  # inside the offset
    ("fixed", 2, 1, 1, 0, 0, None, True),
    ("fixed", 3, 2, 1, 0, 0, None, True),
    ("fixed", 4, 2, 1, 0, 0, None, False),
    ("dynamic_by_explorer", 2, 3, 0, 0, 0, None, False),
    ("dynamic_by_explorer", 3, 3, 0, 0, 0, None, True),
    ("dynamic_by_explorer", 5, 3, 0, 3, 0, None, False),
    ("dynamic_by_explorer", 6, 3, 0, 3, 0, None, True),
    ("dynamic_by_trainer", 1, 1, 0, 0, 0, None, False),  # no trainer status: never wait
    ("dynamic_by_trainer", 1, 1, 0, 0, 0, TrainerStatus("running", 5), False),
    ("dynamic_by_trainer", 1, 1, 0, 0, 0, TrainerStatus("stopped", 5), False),
    ("dynamic_by_trainer", 1, 1, 0, 0, 2, READY, True),
    ("dynamic_by_trainer", 1, 1, 0, 0, 3, READY, False),  # already at the trainer's version
]


@pytest.mark.parametrize("style,step,interval,offset,last,version,trainer,expected", CASES)
def test_sync_decision_table(style, step, interval, offset, last, version, trainer, expected):
    due = sync_due(
        style,
        step,
        interval=interval,
        offset=offset,
        last_sync_step=last,
        model_version=version,
        trainer=trainer,
    )
    assert due is expected


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="sync_style"):
        sync_due("sometimes", 1, interval=1)


def test_trainer_status_file(tmp_path):
    path = tmp_path / "status.json"
    assert read_trainer_status(str(path)) == TrainerStatus()  # missing file: unknown, no wait
    path.write_text(json.dumps({"state": "require_sync", "version": 4}))
    assert read_trainer_status(str(path)) == TrainerStatus("require_sync", 4)
    path.write_text("{not json")
    assert read_trainer_status(str(path)).state == "unknown"
