"""Local Hugging Face dataset folders as tasksets (`operators.tasks.hf_dataset`): the hub's parquet layout
with or without the README's `configs:`, and `save_to_disk` folders; a hub id is refused with a hint."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.tasks.hf_dataset import dataset_files
from operators.tasks.reader import iter_task_tables, plan_taskset
from schemas.config import TasksetConfig, load_config
from schemas.errors import InputError

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
"""


def gsm8k_like(root: Path, readme: bool) -> Path:
    """`root/main/{train,test}-00000-of-00001.parquet`: three train rows, two test rows."""
    (root / "main").mkdir(parents=True)
    for split, n in (("train", 3), ("test", 2)):
        table = pa.table(
            {"question": [f"{split} q{i}" for i in range(n)], "answer": [f"#### {i}" for i in range(n)]}
        )
        pq.write_table(table, root / "main" / f"{split}-00000-of-00001.parquet")
    if readme:
        (root / "README.md").write_text(README)
    return root


def taskset(path: Path, **kwargs) -> TasksetConfig:
    return TasksetConfig(
        name="gsm8k", path=path, format={"prompt_key": "question", "response_key": "answer"}, **kwargs
    )


@pytest.mark.parametrize("readme", [True, False], ids=["readme-configs", "subset-folder"])
def test_a_subset_and_split_stream_as_tasks(tmp_path, readme):
    root = gsm8k_like(tmp_path / "gsm8k", readme)
    cfg = taskset(root, subset_name="main", split="test")
    plan = plan_taskset(cfg, batch_size=2, total_epochs=1, total_steps=None)
    assert plan.rows == 2 and plan.num_steps == 1
    [table] = list(iter_task_tables(cfg, plan, 0, 0))
    assert table.column("prompt").to_pylist() == ["test q0", "test q1"]
    assert table.column("truth").to_pylist() == ["#### 0", "#### 1"]
    assert dataset_files(root, "main", None) == [root / "main" / "train-00000-of-00001.parquet"]  # train


def test_a_save_to_disk_folder_is_read_by_split(tmp_path):
    import datasets

    data = datasets.Dataset.from_dict({"question": ["a", "b"], "answer": ["#### 1", "#### 2"]})
    datasets.DatasetDict(train=data, test=data.select([1])).save_to_disk(str(tmp_path / "saved"))
    cfg = taskset(tmp_path / "saved", split="test")
    plan = plan_taskset(cfg, batch_size=4, total_epochs=1, total_steps=None)
    [table] = list(iter_task_tables(cfg, plan, 0, 0))
    assert table.column("prompt").to_pylist() == ["b"]
    # a save_to_disk folder is recognised without subset or split (train by default)
    assert plan_taskset(taskset(tmp_path / "saved"), 4, 1, None).rows == 2


def test_a_missing_split_lists_the_ones_there_are(tmp_path):
    root = gsm8k_like(tmp_path / "gsm8k", readme=True)
    with pytest.raises(InputError) as info:
        plan_taskset(taskset(root, subset_name="main", split="validation"), 2, 1, None)
    assert info.value.field == "split" and "train" in str(info.value) and "test" in str(info.value)


def test_a_missing_column_names_the_file_and_the_field(tmp_path):
    root = gsm8k_like(tmp_path / "gsm8k", readme=False)
    cfg = TasksetConfig(name="gsm8k", path=root, subset_name="main", split="train")  # prompt_key "prompt"
    with pytest.raises(InputError) as info:
        plan_taskset(cfg, 2, 1, None)
    assert info.value.field == "prompt" and info.value.file.endswith("train-00000-of-00001.parquet")


def test_a_hub_id_is_refused_with_where_to_download_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        plan_taskset(taskset(Path("openai/gsm8k"), subset_name="main", split="train"), 2, 1, None)
    message = str(info.value)
    assert (
        "downloads nothing" in message
        and "huggingface-cli download --repo-type dataset openai/gsm8k" in message
    )


def test_a_bare_hub_id_as_the_taskset_path_gets_the_hint_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["buffer.explorer_input.taskset.path=openai/gsm8k"])  # made absolute
    with pytest.raises(InputError, match="huggingface-cli download --repo-type dataset openai/gsm8k "):
        plan_taskset(cfg.buffer.explorer_input.taskset, 2, 1, None)
