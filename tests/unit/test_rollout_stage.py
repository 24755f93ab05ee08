"""The rollout stage is one value built from the config in one place (`RolloutStage.from_config`)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

from operators.rollout.operator import RolloutStage
from schemas.config import load_config


def test_a_training_stage_carries_the_explorer_settings_and_the_gate():
    cfg = load_config(
        None, ["explorer.max_timeout=77", "explorer.max_retry_times=4", "explorer.batch_timeout=9"]
    )
    ops = [{"name": "reward_filter"}]
    stage = RolloutStage.from_config(cfg, ["run/engine-0"], "run/gate", Path("sink"), ops, last_step=5)
    assert (stage.max_timeout, stage.max_retry_times, stage.batch_timeout) == (77, 4, 9)
    assert stage.engine_names == ("run/engine-0",) and stage.sink_root == "sink" and stage.last_step == 5
    assert stage.over_rollout == cfg.explorer.over_rollout and stage.experience_ops == tuple(ops)
    assert stage.restart_timeout == cfg.explorer.engine_restart_timeout
    assert pickle.loads(pickle.dumps(stage)) == stage  # Ray sends it to every forwarding actor


def test_an_eval_stage_has_no_gate_sink_or_over_rollout():
    stage = RolloutStage.from_config(load_config(None, []), ["a", "b"])
    assert (stage.gate_name, stage.sink_root, stage.over_rollout, stage.experience_ops) == (
        None,
        None,
        None,
        (),
    )


def test_every_field_of_the_stage_is_read_from_the_config(tmp_path):
    """A field added to the stage but not to `from_config` would silently keep its default."""
    settings = ["max_repeat_times_per_runner=3", "batch_timeout=9", "engine_restart_timeout=60"]
    cfg = load_config(None, [f"plugin_dirs=[{tmp_path}]", *(f"explorer.{s}" for s in settings)])
    stage = RolloutStage.from_config(cfg, ["e"], "g", Path("s"), [{"name": "x"}], last_step=2)
    defaults = RolloutStage(engine_names=(), max_timeout=0.0, max_retry_times=0)
    kept = [
        f.name
        for f in dataclasses.fields(RolloutStage)
        if getattr(stage, f.name) == getattr(defaults, f.name)
    ]
    assert not kept, f"fields left at their default: {kept}"
