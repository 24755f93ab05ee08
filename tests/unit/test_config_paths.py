"""A config file's relative paths are its folder's; `--set` paths are the working directory's."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.control.checks import check_inputs
from schemas.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted((ROOT / "pipelines").glob("*.yaml"))


def test_a_config_s_relative_paths_are_its_folder_s_from_another_working_directory(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "model:\n  model_path: ../models/tiny\n"
        "buffer:\n  explorer_input:\n    taskset:\n      path: data/train.jsonl\n"
        "    eval_tasksets:\n      - name: held_out\n        path: data/eval.jsonl\n"
        "synchronizer:\n  checkpoint_dir: ckpt\n"
        "plugin_dirs: [plugins, /abs/plugins]\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("../project/config.yaml"))
    assert cfg.model.model_path == tmp_path / "project/../models/tiny"
    assert cfg.buffer.explorer_input.taskset.path == folder / "data/train.jsonl"
    assert cfg.buffer.explorer_input.eval_tasksets[0].path == folder / "data/eval.jsonl"
    assert cfg.synchronizer.checkpoint_dir == folder / "ckpt"
    assert cfg.plugin_dirs == [folder / "plugins", Path("/abs/plugins")]


def test_paths_given_with_set_are_the_working_directory_s(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text("name: x\n")
    monkeypatch.chdir(tmp_path / "..")
    cfg = load_config(tmp_path / "config.yaml", ["buffer.explorer_input.taskset.path=mine.jsonl"])
    assert cfg.buffer.explorer_input.taskset.path == Path.cwd() / "mine.jsonl"  # saved absolute


@pytest.mark.parametrize("config", BUNDLED, ids=lambda p: p.name)
def test_bundled_configs_pass_their_checks_outside_the_checkout(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(config)
    assert all(p.is_dir() for p in cfg.plugin_dirs)
    check_inputs(cfg)  # taskset, model, plugins and workflow found from here
