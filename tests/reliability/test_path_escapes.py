"""Paths that escape their directory: a `global_step_N` (or its weights) symlinked out of the checkpoint dir,
an index naming shards outside the checkpoint, a plugin file linked out of its plugin dir. Each is refused
with the path named; the weight sync keeps its weights and says why, the benchmark reports the checkpoint as
failed and goes on, and the CLI exits with code 2. Paths a user names (`bench --checkpoints PATH`, a plugin
dir that is itself a link or has `..` in it) are theirs to choose and are not escapes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from operators.engine.checkpoints import (
    CheckpointError,
    check_checkpoint,
    find_checkpoints,
    tensor_meta,
    weight_files,
)
from operators.rollout.plugins import PluginError, load_plugins
from pipelines.benchmark.loop import Bench
from pipelines.benchmark.selection import Candidate, check_candidate, select_candidates
from pipelines.benchmark.state import BenchState
from pipelines.control.weight_sync import CheckpointSource, WeightSyncer
from pipelines.explore import main
from schemas.config import DEFAULT_MODEL, load_config

EXPECTED = tensor_meta(DEFAULT_MODEL)


def checkpoint_copy(path: Path) -> Path:
    """A whole checkpoint of the bundled model (its own weights) at `path`."""
    return Path(shutil.copytree(DEFAULT_MODEL, path))


@pytest.fixture
def ckpts(tmp_path) -> Path:
    """global_step_1 and 2, real; global_step_4 linked to 2 (inside); global_step_5 linked outside."""
    root = tmp_path / "ckpts"
    checkpoint_copy(root / "global_step_1")
    checkpoint_copy(root / "global_step_2")
    (root / "global_step_4").symlink_to("global_step_2")
    (root / "global_step_5").symlink_to(checkpoint_copy(tmp_path / "elsewhere"))
    return root


def refusal(directory: Path, root: Path | None) -> str:
    with pytest.raises(CheckpointError) as info:
        check_checkpoint(directory, EXPECTED, root=root)
    return str(info.value)


# -- checkpoints ---------------------------------------------------------------------------------------------


def test_a_step_dir_linked_outside_the_checkpoint_dir_is_refused(ckpts, tmp_path):
    assert [step for step, _ in find_checkpoints(ckpts)] == [1, 2, 4, 5]  # listed, then refused when checked
    escaped = ckpts / "global_step_5"
    assert refusal(escaped, ckpts) == (
        f"{escaped}: resolves to {tmp_path / 'elsewhere'}, outside the checkpoint dir {ckpts}; refusing it"
    )
    assert check_checkpoint(ckpts / "global_step_4", EXPECTED, root=ckpts) > 0  # a link inside is fine
    assert check_checkpoint(tmp_path / "elsewhere", EXPECTED) > 0  # named by its own path: the user's choice


def test_a_step_dir_that_is_a_symlink_loop_is_listed_and_refused_naming_it(ckpts):
    looping = ckpts / "global_step_7"
    looping.symlink_to(looping)
    assert [step for step, _ in find_checkpoints(ckpts)] == [1, 2, 4, 5, 7]  # not dropped without a word
    assert str(looping) in refusal(looping, ckpts)


def test_weights_linked_outside_the_checkpoint_dir_are_refused(tmp_path):
    root = tmp_path / "ckpts"
    step = checkpoint_copy(root / "global_step_1")
    (step / "model.safetensors").unlink()
    (step / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    assert "model.safetensors: resolves to" in refusal(
        step, root
    ) and "outside the checkpoint dir" in refusal(step, root)
    assert check_checkpoint(step, EXPECTED) > 0  # e.g. a Hugging Face cache snapshot, linked to its blobs


@pytest.mark.parametrize(
    ("shard", "fragment"),
    [
        ("../../x.safetensors", "names shards outside"),
        ("sub/../../x.safetensors", "names shards outside"),
        ("/etc/passwd", "names shards outside"),
        (5, "names shards outside"),
    ],
    ids=["dot-dot", "dot-dot-inside-a-path", "absolute", "not-a-name"],
)
def test_an_index_naming_shards_outside_its_directory_is_refused(tmp_path, shard, fragment):
    step = checkpoint_copy(tmp_path / "global_step_1")
    index = step / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(EXPECTED, shard)}))
    message = refusal(step, None)  # refused even where the user named the directory
    assert message.startswith(f"{index}: ") and fragment in message and str(shard) in message


def test_an_index_of_the_wrong_shape_is_refused_not_a_traceback(tmp_path):
    step = checkpoint_copy(tmp_path / "global_step_1")
    index = step / "model.safetensors.index.json"
    for text in ('{"weight_map": [1, 2]}', '{"weight_map": {"a": "x", "b": 1}}', "[]", "\xff"):
        index.write_text(text, encoding="latin-1")
        with pytest.raises(CheckpointError, match="unreadable index"):
            weight_files(step)


def test_the_weight_sync_keeps_its_weights_and_says_why(ckpts):
    source = CheckpointSource(ckpts, EXPECTED)
    assert source.latest_version() == 4  # the escaped 5 is no version the trainer has
    untouchable = object()  # a fleet that fails the test if any load reaches it
    outcome = WeightSyncer(source, untouchable, timeout=1.0).sync(current=1)
    assert (outcome.ok, outcome.version) == (False, 1)
    assert outcome.reason.startswith(f"refused: {ckpts / 'global_step_5'}: resolves to")


def test_the_benchmark_reports_an_escaped_checkpoint_and_goes_on(ckpts, tmp_path):
    candidates = select_candidates(checkpoint_dir=ckpts)
    assert [(c.step, c.root) for c in candidates] == [(1, ckpts), (2, ckpts), (5, ckpts)]  # 4 is 2's copy
    bench = Bench(load_config(), tmp_path / "run", None, None, BenchState(), {}, EXPECTED)
    assert bench.run_one(candidates[-1]) == "failed"  # before any engine, hash or MLflow run
    (failure,) = bench.report.failures
    assert (
        failure.reason.startswith(f"{ckpts / 'global_step_5'}: resolves to") and "outside" in failure.reason
    )
    check_candidate(Candidate(tmp_path / "elsewhere", 5), EXPECTED, DEFAULT_MODEL)  # --checkpoints PATH


# -- plugins -------------------------------------------------------------------------------------------------

PLUGIN = "LOADED = True\n"  # registers nothing, so the registries stay as they were


@pytest.fixture
def plugin_modules():
    """Plugin modules this test loads are dropped afterwards."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("rftflow_plugin_"):
            del sys.modules[name]


def test_a_plugin_dir_that_is_a_link_or_has_dot_dots_loads(tmp_path, plugin_modules):
    real = tmp_path / "real"
    real.mkdir()
    (real / "mine.py").write_text(PLUGIN)
    (real / "sub").mkdir()
    (real / "sub" / "deeper.py").write_text(PLUGIN)
    (real / "alias.py").symlink_to("sub/deeper.py")  # a link that stays inside
    (tmp_path / "link").symlink_to(real)
    names = load_plugins(real)
    assert len(names) == 2 and all(sys.modules[n].LOADED for n in names)
    assert load_plugins(tmp_path / "link") == names
    assert load_plugins(tmp_path / "real" / "sub" / "..") == names


def test_a_plugin_linked_out_of_its_dir_is_refused_with_exit_code_2(tmp_path, capsys, plugin_modules):
    (tmp_path / "evil.py").write_text("raise SystemExit('must never run')\n")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "evil.py").symlink_to("../evil.py")
    with pytest.raises(PluginError, match="resolves to .*evil.py, outside"):
        load_plugins(plugins)
    run_dir = tmp_path / "run"
    assert main(["--plugin-dir", str(plugins), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    escape = (
        f"plugin {plugins / 'evil.py'} resolves to {tmp_path / 'evil.py'}, outside {plugins}; refusing it"
    )
    assert err == f"error: {escape}\n"
    assert not run_dir.exists()
