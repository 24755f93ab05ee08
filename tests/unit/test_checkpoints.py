"""Hugging Face checkpoints on disk: finding `global_step_N/`, checking one is whole, writing one whole."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from operators.engine.checkpoints import (
    CheckpointError,
    TensorMetaMap,
    check_checkpoint,
    find_checkpoints,
    read_header,
    step_of,
    tensor_meta,
    weight_files,
    write_checkpoint,
)
from schemas.config import DEFAULT_MODEL


def write(root: Path, state: dict[str, torch.Tensor], step: int = 1) -> Path:
    return write_checkpoint(root, step, state, DEFAULT_MODEL)


def truncate(path: Path, nbytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-nbytes])


def raw_safetensors(path: Path, header: bytes, body: bytes = b"") -> Path:
    """A file with a given header and body, bypassing safetensors' own writer."""
    path.write_bytes(struct.pack("<Q", len(header)) + header + body)
    return path


# -- finding checkpoints -----------------------------------------------------------------------------------


def test_find_checkpoints_orders_by_step_number_and_ignores_other_entries(tmp_path: Path) -> None:
    for name in ("global_step_10", "global_step_2", "global_step_1", "global_step_x", "checkpoint", "step_3"):
        (tmp_path / name).mkdir()
    (tmp_path / ".global_step_4.partial").mkdir()  # a write in progress
    (tmp_path / "global_step_5").write_text("a file, not a directory")
    (tmp_path / "trainer_status.json").write_text("{}")

    found = find_checkpoints(tmp_path)

    assert [step for step, _ in found] == [1, 2, 10]
    assert [path for _, path in found] == [tmp_path / f"global_step_{n}" for n in (1, 2, 10)]


def test_find_checkpoints_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert find_checkpoints(tmp_path / "nowhere") == []


@pytest.mark.parametrize(
    "name,step",
    [("global_step_7", 7), ("global_step_0", 0), ("global_step_", None), (".global_step_7.partial", None)],
)
def test_step_of(name: str, step: int | None) -> None:
    assert step_of(Path("/runs") / name) == step


# -- reading headers ---------------------------------------------------------------------------------------


def test_tensor_meta_lists_the_tiny_models_tensors(base_tensors: dict[str, torch.Tensor]) -> None:
    meta = tensor_meta(DEFAULT_MODEL)

    assert meta == {name: (list(t.shape), "float32") for name, t in base_tensors.items()}
    assert "model.embed_tokens.weight" in meta
    assert {dtype for _, dtype in meta.values()} == {"float32"}


def test_read_header_length_matches_the_file() -> None:
    path = DEFAULT_MODEL / "model.safetensors"
    _, length = read_header(path)
    assert length == path.stat().st_size


# -- checking checkpoints ----------------------------------------------------------------------------------


def test_check_checkpoint_accepts_the_models_own_tensors_and_returns_the_bytes(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    ckpt = write(tmp_path, base_tensors)

    nbytes = check_checkpoint(ckpt, expected)

    assert nbytes == (ckpt / "model.safetensors").stat().st_size
    assert nbytes > sum(t.numel() * 4 for t in base_tensors.values())  # data plus header


def test_check_checkpoint_accepts_the_base_model_directory_itself(expected: TensorMetaMap) -> None:
    assert check_checkpoint(DEFAULT_MODEL, expected) == (DEFAULT_MODEL / "model.safetensors").stat().st_size


def test_truncated_file_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    ckpt = write(tmp_path, base_tensors)
    weights = ckpt / "model.safetensors"
    truncate(weights, 100)

    with pytest.raises(CheckpointError, match="truncated") as err:
        check_checkpoint(ckpt, expected)
    assert str(weights) in str(err.value)


def test_file_cut_inside_its_header_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    ckpt = write(tmp_path, base_tensors)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])

    with pytest.raises(CheckpointError, match="header says") as err:
        check_checkpoint(ckpt, expected)
    assert str(weights) in str(err.value)


def test_file_shorter_than_a_header_is_refused(tmp_path: Path, expected: TensorMetaMap) -> None:
    shutil.copy(DEFAULT_MODEL / "config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02\x03")

    with pytest.raises(CheckpointError, match="shorter than a safetensors header"):
        check_checkpoint(tmp_path, expected)


def test_missing_tensor_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    state = dict(base_tensors)
    del state["model.norm.weight"]
    ckpt = write(tmp_path, state)

    with pytest.raises(CheckpointError, match="missing 1 tensors") as err:
        check_checkpoint(ckpt, expected)
    assert "model.norm.weight" in str(err.value)
    assert str(ckpt) in str(err.value)


def test_extra_tensor_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    ckpt = write(tmp_path, {**base_tensors, "lm_head.bias": torch.zeros(3)})

    with pytest.raises(CheckpointError, match="does not have") as err:
        check_checkpoint(ckpt, expected)
    assert "lm_head.bias" in str(err.value)
    assert str(ckpt) in str(err.value)


def test_wrong_shape_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    rows, cols = base_tensors[name].shape
    ckpt = write(tmp_path, {**base_tensors, name: torch.zeros(rows, cols + 1)})

    with pytest.raises(CheckpointError) as err:
        check_checkpoint(ckpt, expected)
    message = str(err.value)
    assert name in message and str(ckpt) in message
    assert f"float32[{rows}, {cols + 1}]" in message and f"float32[{rows}, {cols}]" in message


def test_wrong_dtype_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    name = "model.embed_tokens.weight"
    ckpt = write(tmp_path, {**base_tensors, name: base_tensors[name].half()})

    with pytest.raises(CheckpointError) as err:
        check_checkpoint(ckpt, expected)
    message = str(err.value)
    assert name in message and "float16" in message and "float32" in message


def test_missing_config_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    ckpt = write(tmp_path, base_tensors)
    (ckpt / "config.json").unlink()

    with pytest.raises(CheckpointError, match="no config.json") as err:
        check_checkpoint(ckpt, expected)
    assert str(ckpt) in str(err.value)


def test_directory_without_safetensors_is_refused(tmp_path: Path, expected: TensorMetaMap) -> None:
    shutil.copy(DEFAULT_MODEL / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not what we load")

    with pytest.raises(CheckpointError, match="no .safetensors files") as err:
        check_checkpoint(tmp_path, expected)
    assert str(tmp_path) in str(err.value)


def test_garbage_header_is_refused(tmp_path: Path, expected: TensorMetaMap) -> None:
    shutil.copy(DEFAULT_MODEL / "config.json", tmp_path / "config.json")
    weights = raw_safetensors(tmp_path / "model.safetensors", b"{not json at all", b"\0" * 32)

    with pytest.raises(CheckpointError, match="unreadable safetensors header") as err:
        check_checkpoint(tmp_path, expected)
    assert str(weights) in str(err.value)


def test_unknown_dtype_in_header_is_refused(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F8_E9", "shape": [2], "data_offsets": [0, 2]}}).encode()
    path = raw_safetensors(tmp_path / "model.safetensors", header, b"\0\0")

    with pytest.raises(CheckpointError, match="unknown dtype"):
        read_header(path)


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"w": 5}', b'{"w": {"dtype": "F32"}}'])
def test_json_that_is_not_a_header_is_refused(tmp_path: Path, header: bytes) -> None:
    path = raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 8)

    with pytest.raises(CheckpointError):
        read_header(path)


# -- sharded checkpoints -----------------------------------------------------------------------------------


def write_sharded(directory: Path, state: dict[str, torch.Tensor]) -> list[Path]:
    """Two shards and the index naming them, as `save_pretrained` writes a large model."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEFAULT_MODEL / "config.json", directory / "config.json")
    names = list(state)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: state[n] for n in members}, str(directory / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(members, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return [directory / shard for shard in shards]


def test_sharded_checkpoint_is_accepted(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    shards = write_sharded(tmp_path / "global_step_1", base_tensors)

    assert weight_files(tmp_path / "global_step_1") == shards
    assert tensor_meta(tmp_path / "global_step_1") == expected
    assert check_checkpoint(tmp_path / "global_step_1", expected) == sum(p.stat().st_size for p in shards)


def test_sharded_checkpoint_with_a_missing_shard_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    shards = write_sharded(tmp_path / "global_step_1", base_tensors)
    shards[1].unlink()

    with pytest.raises(CheckpointError, match="shards named in the index are missing") as err:
        check_checkpoint(tmp_path / "global_step_1", expected)
    assert shards[1].name in str(err.value)


def test_sharded_checkpoint_with_a_truncated_shard_is_refused(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    shards = write_sharded(tmp_path / "global_step_1", base_tensors)
    truncate(shards[0], 100)

    with pytest.raises(CheckpointError, match="truncated") as err:
        check_checkpoint(tmp_path / "global_step_1", expected)
    assert str(shards[0]) in str(err.value)


def test_unreadable_index_is_refused(tmp_path: Path, expected: TensorMetaMap) -> None:
    shutil.copy(DEFAULT_MODEL / "config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')

    with pytest.raises(CheckpointError, match="unreadable index"):
        check_checkpoint(tmp_path, expected)


# -- writing checkpoints -----------------------------------------------------------------------------------


def test_write_checkpoint_leaves_a_whole_directory_and_no_partial(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor]
) -> None:
    ckpt = write(tmp_path, base_tensors, step=3)

    assert ckpt == tmp_path / "global_step_3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3"]
    assert not (tmp_path / ".global_step_3.partial").exists()
    written = load_file(str(ckpt / "model.safetensors"))
    assert written.keys() == base_tensors.keys()
    assert all(torch.equal(written[n], base_tensors[n]) for n in base_tensors)


def test_write_checkpoint_copies_the_side_files(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor]
) -> None:
    ckpt = write(tmp_path, base_tensors)

    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert (ckpt / name).read_bytes() == (DEFAULT_MODEL / name).read_bytes(), name
    assert [p.name for p in ckpt.glob("*.safetensors")] == ["model.safetensors"]


def test_write_checkpoint_replaces_a_stale_partial_and_an_older_write(
    tmp_path: Path, base_tensors: dict[str, torch.Tensor], expected: TensorMetaMap
) -> None:
    write(tmp_path, {"only": torch.zeros(1)}, step=2)
    stale = tmp_path / ".global_step_2.partial"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"left by a crashed writer")

    ckpt = write(tmp_path, base_tensors, step=2)

    assert not stale.exists()
    assert check_checkpoint(ckpt, expected) > 0
    assert [step for step, _ in find_checkpoints(tmp_path)] == [2]
