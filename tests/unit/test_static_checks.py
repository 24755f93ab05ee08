"""Everything that can be checked before an engine starts is: numbers, room in the context, enums, the
model directory, paths and YAML bounds. Each refusal is an InputError naming the file or the dotted key."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from pipelines.control.checks import check_inputs, check_model_dir
from schemas.config import DEFAULT_MODEL, load_config
from schemas.errors import InputError

TASKSET = "buffer.explorer_input.taskset"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{TASKSET}.rollout_args.temperature=.nan", f"{TASKSET}.rollout_args.temperature"),
        (f"{TASKSET}.rollout_args.top_p=.inf", f"{TASKSET}.rollout_args.top_p"),
        (f"{TASKSET}.repeat_times=100000000", f"{TASKSET}.repeat_times"),
        ("explorer.rollout_model.dtype=float64x", "explorer.rollout_model.dtype"),
        (f"{TASKSET}.rollout_args.max_tokens=256", f"{TASKSET}.rollout_args.max_tokens"),
        (f"{TASKSET}.path=", f"{TASKSET}.path"),
        ("explorer.max_timeout=1e300", "explorer.max_timeout"),
    ],
)
def test_values_that_can_be_checked_statically_are_refused_with_their_key(override, key):
    with pytest.raises(InputError) as refused:
        load_config(None, [override])
    assert refused.value.field == key


def test_max_tokens_and_max_prompt_tokens_must_fit_max_model_len_together():
    with pytest.raises(InputError, match="max_model_len"):
        load_config(
            None, ["explorer.rollout_model.max_prompt_tokens=200", f"{TASKSET}.rollout_args.max_tokens=100"]
        )


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    bomb = "buffer:\n  explorer_input:\n    taskset:\n      workflow_args:\n" + "".join(
        f"        {line}\n" for line in lines
    )
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    with pytest.raises(InputError, match="alias"):
        load_config(path)


def model_copy(tmp_path):
    return shutil.copytree(DEFAULT_MODEL, tmp_path / "model")


def test_a_model_dir_whose_config_is_not_json_is_refused(tmp_path):
    model = model_copy(tmp_path)
    (model / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not JSON") as refused:
        check_model_dir(model)
    assert refused.value.file == str(model / "config.json")


def test_a_model_dir_without_a_tokenizer_is_refused(tmp_path):
    model = model_copy(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        (model / name).unlink(missing_ok=True)
    with pytest.raises(InputError, match="no tokenizer"):
        check_model_dir(model)


def test_a_named_pipe_as_taskset_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    worker = threading.Thread(target=lambda: refusal(fifo, result), daemon=True)
    worker.start()
    worker.join(timeout=30)  # opening a FIFO with no writer would block for ever
    assert not worker.is_alive() and isinstance(result[0], InputError)
    assert "named pipe" in str(result[0]) and str(fifo) in str(result[0])


def test_a_special_file_inside_a_taskset_directory_is_refused(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    os.mkfifo(folder / "b.jsonl")
    with pytest.raises(InputError, match="named pipe"):
        check_inputs(load_config(None, [f"{TASKSET}.path={folder}"]))


def refusal(path, result: list[BaseException]) -> None:
    try:
        check_inputs(load_config(None, [f"{TASKSET}.path={path}"]))
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        result.append(exc)


def test_an_architecture_vllm_does_not_run_is_refused(tmp_path):
    model = model_copy(tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(InputError, match="NoSuchForCausalLM is not one vLLM") as refused:
        check_model_dir(model)
    assert refused.value.field == "architectures"
