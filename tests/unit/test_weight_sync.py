"""Driver side of weight sync without Ray: checking announced tensors, finding checkpoints, sync metrics."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, write_checkpoint
from operators.engine.transfer import meta_of
from pipelines.control.weight_sync import CheckpointSource, SyncOutcome, check_meta
from schemas.config import DEFAULT_MODEL


def truncate(path: Path, nbytes: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:-nbytes])


# -- check_meta --------------------------------------------------------------------------------------------


def test_check_meta_accepts_the_models_tensors(
    base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    check_meta(meta_of(base_tensors), expected, "version 1")
    # in memory a trainer may hold another dtype: only names and shapes must match
    check_meta(meta_of({n: t.bfloat16() for n, t in base_tensors.items()}), expected, "version 1")
    # shapes may come as tuples or torch.Size
    check_meta([(n, tuple(t.shape), "float32") for n, t in base_tensors.items()], expected, "version 1")


def test_check_meta_refuses_a_missing_tensor(
    base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    meta = [entry for entry in meta_of(base_tensors) if entry[0] != "model.norm.weight"]

    with pytest.raises(CheckpointError, match="do not match the model") as err:
        check_meta(meta, expected, "version 7")
    assert "version 7" in str(err.value) and "model.norm.weight" in str(err.value)


def test_check_meta_refuses_an_extra_tensor(
    base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    meta = [*meta_of(base_tensors), ("lm_head.weight", [277, 128], "float32")]

    with pytest.raises(CheckpointError, match="do not match the model") as err:
        check_meta(meta, expected, "version 7")
    assert "lm_head.weight" in str(err.value)


def test_check_meta_refuses_a_wrong_shape(
    base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    name = "model.layers.1.mlp.up_proj.weight"
    meta = [(n, [1, 1] if n == name else s, d) for n, s, d in meta_of(base_tensors)]

    with pytest.raises(CheckpointError, match="has shape") as err:
        check_meta(meta, expected, "version 7")
    assert name in str(err.value) and str(expected[name][0]) in str(err.value)


# -- CheckpointSource --------------------------------------------------------------------------------------


def test_next_update_returns_the_newest_whole_checkpoint_above_current(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write_checkpoint(tmp_path, 1, base_tensors, DEFAULT_MODEL)
    newest = write_checkpoint(tmp_path, 2, base_tensors, DEFAULT_MODEL)
    source = CheckpointSource(tmp_path, expected)

    update = source.next_update(0, timeout=0.3)

    assert update is not None
    assert (update.version, update.kind, update.path) == (2, "checkpoint", newest)
    assert source.next_update(1, timeout=0.3).version == 2


def test_next_update_returns_none_after_the_timeout_when_nothing_is_newer(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write_checkpoint(tmp_path, 1, base_tensors, DEFAULT_MODEL)
    write_checkpoint(tmp_path, 2, base_tensors, DEFAULT_MODEL)
    source = CheckpointSource(tmp_path, expected)

    started = time.monotonic()
    update = source.next_update(2, timeout=0.3)
    waited = time.monotonic() - started

    assert update is None
    assert 0.3 <= waited < 5


def test_next_update_picks_up_a_checkpoint_written_while_it_waits(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    writer = threading.Timer(0.1, write_checkpoint, (tmp_path, 1, base_tensors, DEFAULT_MODEL))
    writer.start()
    try:
        update = CheckpointSource(tmp_path, expected).next_update(0, timeout=10)
    finally:
        writer.join()

    assert update is not None and update.version == 1


@pytest.mark.parametrize("explicit", [False, True])
def test_next_update_returns_promptly_once_the_trainer_has_stopped(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap, explicit: bool
) -> None:
    write_checkpoint(tmp_path, 1, base_tensors, DEFAULT_MODEL)
    status = tmp_path / ("elsewhere.json" if explicit else "trainer_status.json")
    status.write_text(json.dumps({"state": "stopped", "version": 0}))
    source = CheckpointSource(tmp_path, expected, trainer_status=str(status) if explicit else None)

    started = time.monotonic()
    update = source.next_update(1, timeout=30)

    assert update is None
    assert time.monotonic() - started < 5  # liveness: nowhere near the 30 s timeout


def test_a_stopped_trainers_last_checkpoint_is_still_handed_out(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write_checkpoint(tmp_path, 3, base_tensors, DEFAULT_MODEL)
    (tmp_path / "trainer_status.json").write_text(json.dumps({"state": "stopped", "version": 3}))

    update = CheckpointSource(tmp_path, expected).next_update(0, timeout=30)

    assert update is not None and update.version == 3


def test_next_update_refuses_a_truncated_newest_checkpoint(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write_checkpoint(tmp_path, 1, base_tensors, DEFAULT_MODEL)
    newest = write_checkpoint(tmp_path, 2, base_tensors, DEFAULT_MODEL)
    truncate(newest / "model.safetensors")

    with pytest.raises(CheckpointError, match="truncated") as err:
        CheckpointSource(tmp_path, expected).next_update(0, timeout=0.3)
    assert "global_step_2" in str(err.value)


def test_latest_version_skips_a_corrupt_newest_checkpoint(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write_checkpoint(tmp_path, 1, base_tensors, DEFAULT_MODEL)
    write_checkpoint(tmp_path, 2, base_tensors, DEFAULT_MODEL)
    truncate(write_checkpoint(tmp_path, 10, base_tensors, DEFAULT_MODEL) / "model.safetensors")
    source = CheckpointSource(tmp_path, expected)

    assert source.latest_version() == 2


def test_latest_version_without_checkpoints_is_zero(tmp_path: Path, expected: TensorMetaMap) -> None:
    assert CheckpointSource(tmp_path, expected).latest_version() == 0
    assert CheckpointSource(tmp_path / "not-yet", expected).latest_version() == 0


# -- SyncOutcome -------------------------------------------------------------------------------------------


def test_sync_outcome_metrics() -> None:
    outcome = SyncOutcome(3, True, wait_s=0.5, pause_s=0.25, nbytes=1024, seconds=1.5)

    assert outcome.metrics(failures=2) == {
        "time/sync_weight": 1.5,
        "sync/model_version": 3.0,
        "sync/pause_s": 0.25,
        "sync/bytes": 1024.0,
        "sync/wait_s": 0.5,
        "sync/succeeded": 1.0,
        "sync/failed": 2.0,
    }


def test_failed_sync_outcome_metrics() -> None:
    metrics = SyncOutcome(1, False, reason="refused").metrics(failures=1)

    assert metrics["sync/succeeded"] == 0.0 and metrics["sync/failed"] == 1.0
    assert metrics["sync/model_version"] == 1.0
    assert all(isinstance(v, float) for v in metrics.values())
