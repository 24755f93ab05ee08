"""The static checks, each in general: every float field is finite, bounds, room in max_model_len, enums,
empty and special paths, unreadable files, the model directory, and what a YAML file may cost. Each refusal
is an InputError naming the file (and line) or the dotted key."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import operators.tasks.reader as reader
import operators.tasks.rows as rows
from pipelines.control.checks import check_inputs, check_model_dir, vllm_architectures
from schemas.config import DEFAULT_MODEL, Config, TasksetConfig, load_config
from schemas.errors import InputError

TASKSET = "buffer.explorer_input.taskset"
ROW = '{"prompt": "1+1", "answer": "2"}\n'


def refused(path: Path | None = None, overrides: list[str] | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        load_config(path, overrides)
    return info.value


def in_time(call: Callable[[], Any], seconds: float = 30) -> BaseException | None:
    """What `call` raised (None: nothing), run in a thread so that a call blocked on a FIFO fails the test."""
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked: something opened a special file"
    return result[0]


# --- numbers ------------------------------------------------------------------------------------------------


def float_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every float field's dotted key (a list field's items at index 0), found from the schema itself."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
        if float in args:
            keys.append(f"{prefix}{name}")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += float_keys(annotation, f"{prefix}{name}.")
    return keys


FLOAT_KEYS = float_keys(Config)


def test_the_schema_has_float_fields_to_check():
    assert f"{TASKSET}.rollout_args.temperature" in FLOAT_KEYS and "explorer.max_timeout" in FLOAT_KEYS
    assert len(FLOAT_KEYS) >= 10


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_no_float_field_takes_nan_or_inf(key, value):
    err = refused(None, [f"{key}={value}"])
    assert err.field == key and "finite number" in str(err)


def test_eval_taskset_floats_are_finite_too():
    err = refused(
        None, ["buffer.explorer_input.eval_tasksets=[{name: e, rollout_args: {temperature: .nan}}]"]
    )
    assert err.field == "buffer.explorer_input.eval_tasksets.0.rollout_args.temperature"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (f"{TASKSET}.repeat_times", "1025"),
        (f"{TASKSET}.rollout_args.temperature", "11"),
        (f"{TASKSET}.rollout_args.logprobs", "21"),  # vLLM's max_logprobs, which the engine keeps
        (f"{TASKSET}.rollout_args.top_k", str(2**40)),
        ("buffer.batch_size", str(10**7)),
        ("buffer.total_epochs", str(10**9)),
        ("explorer.rollout_model.engine_num", "100000"),
        ("explorer.rollout_model.tensor_parallel_size", "1000"),
        ("explorer.rollout_model.max_model_len", str(2**30)),
        ("explorer.rollout_model.seed", "-1"),
        ("explorer.rollout_model.seed", str(2**32)),  # NumPy seeds take 0..2^32-1
        ("explorer.max_timeout", "1e12"),  # threading refuses a timeout this large
        ("synchronizer.sync_timeout", "1e12"),
        ("explorer.max_retry_times", "1000000"),
    ],
)
def test_numbers_past_a_sane_bound_are_refused(key, value):
    assert refused(None, [f"{key}={value}"]).field == key


def test_the_defaults_sit_inside_every_bound():
    assert load_config() == Config()


# --- room in max_model_len ----------------------------------------------------------------------------------


def test_max_tokens_must_leave_room_for_a_prompt_naming_both_keys():
    err = refused(None, [f"{TASKSET}.rollout_args.max_tokens=256"])
    assert err.field == f"{TASKSET}.rollout_args.max_tokens"
    assert f"{TASKSET}.rollout_args.max_tokens (256)" in str(err)
    assert "explorer.rollout_model.max_model_len (256)" in str(err)
    assert load_config(None, [f"{TASKSET}.rollout_args.max_tokens=255"])  # one token left for the prompt


def test_each_eval_tasksets_max_tokens_is_checked_by_its_index():
    tasksets = "[{name: a}, {name: b, rollout_args: {max_tokens: 4096}}]"
    err = refused(
        None, [f"buffer.explorer_input.eval_tasksets={tasksets}", "explorer.rollout_model.max_model_len=1024"]
    )
    assert err.field == "buffer.explorer_input.eval_tasksets.1.rollout_args.max_tokens"
    assert "max_model_len (1024)" in str(err)


def test_max_prompt_tokens_plus_max_tokens_must_fit():
    overrides = ["explorer.rollout_model.max_prompt_tokens=200", f"{TASKSET}.rollout_args.max_tokens=57"]
    err = refused(None, overrides)
    assert "explorer.rollout_model.max_prompt_tokens (200)" in str(err) and "(57)" in str(err)
    assert load_config(None, [overrides[0], f"{TASKSET}.rollout_args.max_tokens=56"])  # 256 exactly


def test_room_is_checked_again_for_a_config_changed_after_loading(tmp_path):
    """The bench's `--taskset` tasksets are model copies (never validated): check_inputs checks them."""
    cfg = load_config()
    taskset = cfg.buffer.explorer_input.taskset
    big = taskset.model_copy(
        update={"rollout_args": taskset.rollout_args.model_copy(update={"max_tokens": 999})}
    )
    cfg.buffer.explorer_input.eval_tasksets = [big]
    with pytest.raises(InputError) as info:
        check_inputs(cfg, train=False)
    assert info.value.field == "buffer.explorer_input.eval_tasksets.0.rollout_args.max_tokens"


# --- enums --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["auto", "half", "float16", "bfloat16", "float", "float32"])
def test_every_vllm_dtype_name_is_taken(dtype):
    assert load_config(None, [f"explorer.rollout_model.dtype={dtype}"]).explorer.rollout_model.dtype == dtype


@pytest.mark.parametrize("dtype", ["fp16", "float64", "bf16", "AUTO", ""])
def test_other_dtypes_are_refused_naming_the_choices(dtype):
    err = refused(None, [f"explorer.rollout_model.dtype={dtype}"])
    assert err.field == "explorer.rollout_model.dtype" and "'bfloat16'" in str(err)


def test_an_unknown_workflow_or_reward_names_its_dotted_key():
    with pytest.raises(InputError) as info:
        check_inputs(load_config(None, [f"{TASKSET}.default_workflow_type=nope"]))
    assert info.value.field == f"{TASKSET}.default_workflow_type" and "unknown workflow 'nope'" in str(
        info.value
    )
    evals = "buffer.explorer_input.eval_tasksets=[{name: e, default_reward_fn_type: nope}]"
    with pytest.raises(InputError) as info:
        check_inputs(load_config(None, [evals]), train=False)
    assert info.value.field == "buffer.explorer_input.eval_tasksets.0.default_reward_fn_type"
    overrides = ["buffer.explorer_input.eval_tasksets=[{name: e}]"]
    overrides.append("buffer.explorer_input.default_eval_workflow_type=nope")
    with pytest.raises(InputError) as info:
        check_inputs(load_config(None, overrides), train=False)
    assert info.value.field == "buffer.explorer_input.default_eval_workflow_type"


# --- paths --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{TASKSET}.path=", f"{TASKSET}.path"),
        (f"{TASKSET}.path='  '", f"{TASKSET}.path"),
        ("model.model_path=", "model.model_path"),
        ("synchronizer.checkpoint_dir=''", "synchronizer.checkpoint_dir"),
        ("plugin_dirs=['']", "plugin_dirs.0"),
        (
            "buffer.explorer_input.eval_tasksets=[{name: e, path: ''}]",
            "buffer.explorer_input.eval_tasksets.0.path",
        ),
        (f'{TASKSET}.path="a\\0b"', f"{TASKSET}.path"),  # YAML's "\0": a NUL character
    ],
)
def test_an_empty_path_is_refused_not_taken_as_the_working_directory(override, key):
    err = refused(None, [override])
    assert err.field == key and "empty path" in str(err)


def check_taskset(path: Path) -> BaseException | None:
    return in_time(lambda: check_inputs(load_config(None, [f"{TASKSET}.path={path}"])))


def test_a_socket_or_a_device_as_taskset_is_refused(tmp_path):
    sock_path = tmp_path / "tasks.jsonl"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        err = check_taskset(sock_path)
    assert isinstance(err, InputError) and err.file == str(sock_path) and "a socket" in str(err)
    err = check_taskset(Path("/dev/null"))
    assert isinstance(err, InputError) and "character device" in str(err)


@pytest.mark.parametrize("kind", ["fifo", "socket", "broken link"])
def test_a_special_entry_in_a_taskset_directory_is_refused_before_anything_opens_it(tmp_path, kind):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "a.jsonl").write_text(ROW)
    special = folder / "b.jsonl"
    sock = socket.socket(socket.AF_UNIX)
    try:
        if kind == "fifo":
            os.mkfifo(special)
        elif kind == "socket":
            sock.bind(str(special))
        else:
            special.symlink_to(folder / "missing.jsonl")
        err = check_taskset(folder)
    finally:
        sock.close()
    assert isinstance(err, InputError) and err.file == str(special)
    assert {"fifo": "named pipe", "socket": "a socket", "broken link": "link to a missing file"}[kind] in str(
        err
    )


def test_a_subdirectory_and_other_suffixes_in_a_taskset_directory_are_left_alone(tmp_path):
    folder = tmp_path / "tasks"
    (folder / "sub.jsonl").mkdir(parents=True)
    (folder / "a.jsonl").write_text(ROW)
    os.mkfifo(folder / "notes.txt")  # not a taskset file: never looked at
    assert check_taskset(folder) is None


def test_a_file_that_cannot_be_opened_is_an_input_error_naming_it(tmp_path, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text(ROW)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rows.os, "open", denied)  # running as root, chmod would not stop the read
    with pytest.raises(InputError) as info:
        list(rows.iter_raw_rows(path, 1 << 20))
    assert info.value.file == str(path) and "Permission denied" in str(info.value)


def test_a_directory_or_a_fifo_read_as_rows_is_refused_without_blocking(tmp_path):
    """What the Ray Data read would meet if a file were swapped after planning."""
    fifo = tmp_path / "late.jsonl"
    os.mkfifo(fifo)
    for path, kind in [(fifo, "named pipe"), (tmp_path, "a directory")]:
        err = in_time(lambda p=path: list(rows.iter_raw_rows(p, 1 << 20)))
        assert isinstance(err, InputError) and err.file == str(path) and kind in str(err)


def test_a_read_error_in_the_middle_of_a_file_names_it(tmp_path, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text(ROW * 3)
    real = rows.open_taskset_file

    class Failing:
        def __init__(self, handle):
            self.handle, self.lines = handle, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def readline(self, limit):
            self.lines += 1
            if self.lines == 2:
                raise OSError(5, "Input/output error")
            return self.handle.readline(limit)

    monkeypatch.setattr(rows, "open_taskset_file", lambda file: Failing(real(file)))
    with pytest.raises(InputError) as info:
        list(rows.iter_raw_rows(path, 1 << 20))
    assert info.value.file == str(path) and "Input/output error" in str(info.value)


def test_a_taskset_config_with_a_path_keeps_working(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(ROW)
    assert [n for _, n in reader.plan_taskset(TasksetConfig(path=path), 1, 1, None).files] == [1]


# --- the model directory ------------------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path) -> Path:
    return Path(shutil.copytree(DEFAULT_MODEL, tmp_path / "model"))


def write_config(model: Path, **changes: Any) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def model_refusal(model: Path) -> InputError:
    with pytest.raises(InputError) as info:
        check_model_dir(model)
    return info.value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("[1, 2]", "a JSON array, not an object"), ('"llama"', "a JSON string"), ("", "not JSON"),
     ("[" * 100_000, "nested too deeply")],
)  # fmt: skip
def test_a_config_json_that_is_not_a_json_object_is_refused_naming_it(model, text, fragment):
    (model / "config.json").write_text(text)
    err = model_refusal(model)
    assert err.file == str(model / "config.json") and fragment in str(err)


def test_a_config_json_not_in_utf8_or_not_a_file_is_refused_naming_it(model):
    (model / "config.json").write_bytes(b'{"architectures": ["caf\xe9"]}')
    err = model_refusal(model)
    assert err.file == str(model / "config.json") and "UTF-8" in str(err)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    err = in_time(lambda: check_model_dir(model))
    assert isinstance(err, InputError) and "named pipe" in str(err)


@pytest.mark.parametrize("architectures", [None, [], "LlamaForCausalLM", [1]])
def test_a_config_json_must_name_its_architectures(model, architectures):
    write_config(model, architectures=architectures)
    err = model_refusal(model)
    assert err.field == "architectures" and "names no architectures" in str(err)


def test_one_architecture_vllm_knows_is_enough(model):
    write_config(model, architectures=["NoSuchForCausalLM", "LlamaForCausalLM"])
    check_model_dir(model)


@pytest.mark.skipif(vllm_architectures() is None, reason="vLLM is not installed: no architecture check")
def test_an_architecture_transformers_has_is_left_to_vllms_transformers_backend(model):
    assert "GPTNeoForCausalLM" not in vllm_architectures()
    write_config(model, architectures=["GPTNeoForCausalLM"])
    check_model_dir(model)


@pytest.mark.skipif(vllm_architectures() is None, reason="vLLM is not installed: no architecture check")
def test_removed_architectures_are_not_taken_as_known():
    assert "LlamaForCausalLM" in vllm_architectures()
    assert "AquilaForCausalLM" not in vllm_architectures()  # in _PREVIOUSLY_SUPPORTED_MODELS (0.24.0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_architectures_read_from_source_are_vllms_registry():
    """The source reading stays true to `ModelRegistry.get_supported_archs()` (in a child: vLLM's import
    takes seconds and changes process state)."""
    code = (
        "import json\nfrom vllm.model_executor.models import ModelRegistry\n"
        "print(json.dumps(sorted(ModelRegistry.get_supported_archs())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == vllm_architectures()


def test_tensor_parallel_size_must_divide_the_attention_heads(model):
    cfg = load_config(None, [f"model.model_path={model}", "explorer.rollout_model.tensor_parallel_size=3"])
    with pytest.raises(InputError) as info:
        check_inputs(cfg)
    assert info.value.field == "explorer.rollout_model.tensor_parallel_size" and "2 attention heads" in str(
        info.value
    )
    check_inputs(
        load_config(None, [f"model.model_path={model}", "explorer.rollout_model.tensor_parallel_size=2"])
    )


def test_max_model_len_past_the_models_positions_is_refused_before_an_engine(model):
    positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    cfg = load_config(
        None, [f"model.model_path={model}", f"explorer.rollout_model.max_model_len={positions + 1}"]
    )
    with pytest.raises(InputError) as info:
        check_inputs(cfg)
    assert info.value.field == "explorer.rollout_model.max_model_len"
    assert f"model's {positions} positions" in str(info.value)


# --- YAML ---------------------------------------------------------------------------------------------------


def write(tmp_path: Path, content: str | bytes, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_a_billion_laughs_in_workflow_args_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]  # 10^9 values
    body = "".join(f"        {line}\n" for line in lines)
    path = write(tmp_path, f"buffer:\n  explorer_input:\n    taskset:\n      workflow_args:\n{body}")
    start = time.process_time()  # CPU time: what refusing costs, not how busy the machine's other core is
    err = refused(path)
    assert time.process_time() - start < 2 and err.file == str(path) and "alias" in str(err)


def test_a_self_referring_alias_is_refused(tmp_path):
    err = refused(
        write(tmp_path, "buffer:\n  explorer_input:\n    taskset:\n      workflow_args: &w {w: *w}\n")
    )
    assert "cycle" in str(err) and "line 4" in str(err) and str(tmp_path / "cfg.yaml") in str(err)
    assert "<unicode string>" not in str(err)  # the YAML mark names the file too


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 70 + "]" * 70, "a: " + "{b: " * 80 + "1" + "}" * 80])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, text):
    assert "levels" in str(refused(write(tmp_path, text)))


def test_a_few_aliases_are_still_fine(tmp_path):
    text = (
        "buffer:\n  explorer_input:\n    taskset: &train {name: t, repeat_times: 2}\n"
        "    eval_tasksets: [*train]\n"
    )
    cfg = load_config(write(tmp_path, text))
    assert cfg.buffer.explorer_input.eval_tasksets == [cfg.buffer.explorer_input.taskset]


def test_a_config_file_over_1_mib_is_refused(tmp_path):
    err = refused(write(tmp_path, "name: x\n" + "# padding\n" * 120_000))
    assert "over 1 MiB" in str(err)


@pytest.mark.parametrize(
    ("content", "row", "fragment"),
    [
        (b"name: ok\nproject: caf\xe9\n", 2, "save it as UTF-8"),
        ("name: x\n".encode("utf-16"), 1, "UTF-16 byte-order mark"),
    ],
)
def test_a_config_file_not_in_utf8_is_refused_at_its_line(tmp_path, content, row, fragment):
    path = write(tmp_path, content)
    err = refused(path)
    assert (err.file, err.row) == (str(path), row) and "not UTF-8" in str(err) and fragment in str(err)


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    assert load_config(write(tmp_path, "\ufeffname: bom\n".encode())).name == "bom"


def test_a_config_that_is_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    err = in_time(lambda: load_config(fifo))
    assert isinstance(err, InputError) and err.file == str(fifo) and "named pipe" in str(err)
    assert "a directory" in str(refused(tmp_path))


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("name=[", "not valid YAML"), ("name=*x", "not valid YAML"), ("name=" + "9" * 5000, "4300")],
)
def test_a_bad_set_value_is_an_input_error_naming_the_key(override, fragment):
    err = refused(None, [override])
    assert err.file == "--set" and err.field == "name" and fragment in str(err)
