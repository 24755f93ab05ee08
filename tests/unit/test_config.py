"""Configuration: defaults, YAML + `--set` overrides typed by YAML, and errors that name the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schemas.config import DEFAULT_MODEL, DEFAULT_TRAIN, Config, flatten, load_config, parse_override
from schemas.errors import InputError


@pytest.fixture
def config_file(tmp_path):
    def write(tree) -> Path:
        path = tmp_path / "cfg.yaml"
        path.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree))
        return path

    return write


def refused(path: Path | None = None, overrides: list[str] | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        load_config(path, overrides)
    return info.value


def test_defaults_are_valid_and_point_at_bundled_assets():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.buffer.batch_size == 8 and cfg.buffer.total_steps is None
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset.path == DEFAULT_TRAIN and DEFAULT_TRAIN.is_file()
    assert cfg.model.model_path == DEFAULT_MODEL
    assert taskset.rollout_args.temperature == 1.0 and taskset.repeat_times == 4


def test_default_sections_are_not_shared_between_configs():
    first = Config()
    first.buffer.batch_size = 3
    first.buffer.explorer_input.taskset.format.prompt_key = "q"
    fresh = Config()
    assert fresh.buffer.batch_size == 8
    assert fresh.buffer.explorer_input.taskset.format.prompt_key == "prompt"


def test_yaml_file_with_overrides_typed_by_yaml(config_file):
    path = config_file({"name": "mine", "buffer": {"batch_size": 2, "total_epochs": 3}})
    cfg = load_config(
        path,
        [
            "buffer.batch_size=16",
            "buffer.explorer_input.taskset.rollout_args.temperature=0.5",
            "buffer.total_steps=null",
            "explorer.rollout_model.enforce_eager=false",
        ],
    )
    assert cfg.name == "mine"
    assert cfg.buffer.batch_size == 16 and isinstance(cfg.buffer.batch_size, int)
    assert cfg.buffer.total_epochs == 3  # untouched YAML values survive overrides of siblings
    temperature = cfg.buffer.explorer_input.taskset.rollout_args.temperature
    assert temperature == 0.5 and isinstance(temperature, float)
    assert cfg.buffer.total_steps is None
    assert cfg.explorer.rollout_model.enforce_eager is False


def test_later_override_wins():
    assert load_config(None, ["buffer.batch_size=2", "buffer.batch_size=5"]).buffer.batch_size == 5


def test_parse_override():
    assert parse_override(" buffer.batch_size = 16") == ("buffer.batch_size", 16)
    assert parse_override("a.b=x=y") == ("a.b", "x=y")
    assert parse_override("a.b=") == ("a.b", "")
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])


@pytest.mark.parametrize("text", ["buffer.batch_size", "=3", "  =3"])
def test_malformed_override_is_refused(text):
    err = refused(None, [text])
    assert err.field == "--set"
    assert "expected key=value" in str(err) and text in str(err)


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["bogus=1"], "bogus", "Extra inputs are not permitted"),
        (["buffer.explorer_input.taskset.bogus=1"], "buffer.explorer_input.taskset.bogus", "Extra inputs"),
        (["buffer.batch_size=abc"], "buffer.batch_size", "valid integer"),
        (["buffer.batch_size=0"], "buffer.batch_size", "greater than or equal to 1"),
        (
            ["buffer.explorer_input.taskset.rollout_args.top_p=2"],
            "buffer.explorer_input.taskset.rollout_args.top_p",
            "less than or equal to 1",
        ),
        (["explorer.rollout_model.device=tpu"], "explorer.rollout_model.device", "'auto', 'cpu' or 'gpu'"),
        (["buffer=3"], "buffer", "valid dictionary"),
    ],
    ids=[
        "top-level-key",
        "nested-key",
        "wrong-type",
        "out-of-range",
        "nested-range",
        "bad-literal",
        "not-a-section",
    ],
)
def test_invalid_overrides_name_the_dotted_key(overrides, key, fragment):
    err = refused(None, overrides)
    assert err.field == key and err.file == "--set"
    assert f"field '{key}'" in str(err)
    assert fragment in str(err)


def test_invalid_yaml_values_name_the_file_and_key(config_file):
    path = config_file({"buffer": {"explorer_input": {"taskset": {"bogus": 1, "repeat_times": "x"}}}})
    err = refused(path)
    assert err.file == str(path)
    assert err.field in {"buffer.explorer_input.taskset.bogus", "buffer.explorer_input.taskset.repeat_times"}
    assert str(err).startswith(f"{path}, field 'buffer.explorer_input.taskset.")
    assert "(and 1 more)" in str(err)


def test_override_below_a_scalar_is_refused(config_file):
    err = refused(config_file({"name": "x"}), ["name.sub=1"])
    assert err.field == "name.sub"
    assert "'name' is not a section" in str(err)


def test_missing_config_file_is_refused(tmp_path):
    path = tmp_path / "absent.yaml"
    err = refused(path)
    assert err.file == str(path)
    assert str(err) == f"{path}: config file not found"


@pytest.mark.parametrize(
    ("text", "fragment"), [("buffer: [unclosed", "not valid YAML"), ("- a\n- b\n", "must be a mapping")]
)
def test_bad_yaml_files_are_refused(config_file, text, fragment):
    path = config_file(text)
    err = refused(path)
    assert err.file == str(path) and fragment in str(err)


def test_empty_yaml_file_gives_defaults(config_file):
    assert load_config(config_file("")) == Config()


def test_flatten_gives_dotted_string_values():
    flat = flatten(load_config(None, ["buffer.batch_size=16"]))
    assert flat["buffer.batch_size"] == "16"
    assert flat["buffer.explorer_input.taskset.rollout_args.temperature"] == "1.0"
    assert flat["buffer.explorer_input.taskset.format.prompt_key"] == "prompt"
    assert flat["buffer.total_steps"] == "None"
    assert flat["buffer.explorer_input.taskset.workflow_args"] == "{}"  # an empty section is one leaf
    assert flat["model.model_path"] == str(DEFAULT_MODEL)
    assert all(isinstance(v, str) for v in flat.values())
    assert not any(isinstance(v, dict) for v in flat.values())


EXPERIENCE_BUFFER = "buffer.trainer_input.experience_buffer"


def test_experience_buffer_defaults_to_parquet_without_a_queue():
    buffer = load_config().buffer.trainer_input.experience_buffer
    assert (buffer.storage_type, buffer.path, buffer.name) == ("parquet", None, None)
    assert buffer.queue_capacity is None and buffer.queue_timeout == 600
    sql = load_config(
        None, [f"{EXPERIENCE_BUFFER}.storage_type=sql", f"{EXPERIENCE_BUFFER}.queue_capacity=2"]
    )
    assert sql.buffer.trainer_input.experience_buffer.queue_capacity == 2


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        (["path=sqlite:////x.db"], EXPERIENCE_BUFFER, "path and name are for storage_type sql"),
        (["storage_type=sql", "name=my-run"], f"{EXPERIENCE_BUFFER}.name", "should match pattern"),
        (["storage_type=sql", f"name={'x' * 49}"], f"{EXPERIENCE_BUFFER}.name", "at most 48 characters"),
        (["queue_capacity=0"], f"{EXPERIENCE_BUFFER}.queue_capacity", "greater than or equal to 1"),
        (["storage_type=queue"], f"{EXPERIENCE_BUFFER}.storage_type", "'parquet' or 'sql'"),
    ],
)
def test_bad_experience_buffer_settings_are_refused(overrides, field, fragment):
    err = refused(None, [f"{EXPERIENCE_BUFFER}.{o}" for o in overrides])
    assert err.field == field and fragment in str(err)


def test_own_configs_read_the_environment_and_keep_other_dollar_braces(config_file, monkeypatch):
    monkeypatch.setenv("RFTFLOW_TEST_MODEL", str(DEFAULT_MODEL))
    monkeypatch.delenv("RFTFLOW_TEST_UNSET", raising=False)
    path = config_file(
        {
            "model": {"model_path": "${oc.env:RFTFLOW_TEST_MODEL}"},
            "name": "${oc.env:RFTFLOW_TEST_UNSET,fallback}",
            "buffer": {"explorer_input": {"taskset": {"workflow_args": {"system_prompt": "${not.a.key}"}}}},
        }
    )
    cfg = load_config(path)
    assert cfg.model.model_path == DEFAULT_MODEL and cfg.name == "fallback"
    assert cfg.buffer.explorer_input.taskset.workflow_args == {"system_prompt": "${not.a.key}"}
    assert flatten(cfg)["model.model_path"] == "${oc.env:RFTFLOW_TEST_MODEL}"  # never the value
    unset = config_file({"name": "${oc.env:RFTFLOW_TEST_UNSET}"})
    assert refused(unset).field == "name" and "RFTFLOW_TEST_UNSET is not set" in str(refused(unset))
