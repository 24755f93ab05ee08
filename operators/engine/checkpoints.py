"""Hugging Face checkpoints on disk: find `global_step_N/`, check one is whole, write one atomically.

A trainer may be halfway through writing a checkpoint when the explorer looks, or may have died mid-write.
Loading such a directory would put garbage into every engine, so a checkpoint is checked before any engine
sees it: every safetensors file must be as long as its header says, and together they must hold exactly the
base model's tensors, each with the base model's shape and dtype. Only the headers are read, so the check is
cheap whatever the model's size.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path
from typing import Any

from schemas.atomic import atomic_replace
from schemas.run_dir import (
    CHECKPOINT_DIR,
    checkpoint_dir_name,
    checkpoint_version,
    partial_checkpoint_dir_name,
)

# name -> (shape, dtype as torch names it)
TensorMetaMap = dict[str, tuple[list[int], str]]

STEP_DIR = CHECKPOINT_DIR
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
# Files a trainer does not write but vLLM needs: copied from the base model into each checkpoint.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
SIDE_SUFFIXES = (".jinja", ".model", ".txt")

HASH_CHUNK = 1 << 20  # bytes read at a time when hashing weights
# A Trinity-RFT trainer's checkpoint layout: the HF copy of step N, and the files naming the newest step.
TRINITY_MODEL_DIR = Path("actor") / "huggingface"
TRINITY_LATEST_FILES = ("latest_state_dict_iteration.txt", "latest_checkpointed_iteration.txt")


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded; the message names the directory, file and tensor."""


def step_of(path: Path) -> int | None:
    return checkpoint_version(Path(path).name)


def find_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """`(N, path)` for every `global_step_N/` under `root`, by ascending N (so 2 comes before 10).

    A Trinity-RFT trainer's layout reads too: the model folder of `global_step_N/actor/huggingface/`, and
    no step above the one its `latest_*_iteration.txt` names (a higher one is still being written).
    A `global_step_N` link that resolves to no folder (broken, or a loop) is kept: reading it then fails with
    that checkpoint's own message, rather than the step vanishing without a word."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir() or p.is_symlink()]
    newest = latest_marked(root)
    return sorted(
        (step, model_dir(p)) for step, p in found if step is not None and (newest is None or step <= newest)
    )


def model_dir(step_dir: Path) -> Path:
    """The Hugging Face model folder of a step: the step folder itself, or Trinity-RFT's
    `actor/huggingface/` inside it when only that holds a config.json."""
    trinity = Path(step_dir) / TRINITY_MODEL_DIR
    try:
        if not (Path(step_dir) / "config.json").exists() and (trinity / "config.json").is_file():
            return trinity
    except OSError:  # a loop or a vanished folder: its check names it
        pass
    return Path(step_dir)


def latest_marked(root: Path) -> int | None:
    """The newest complete step a Trinity-RFT trainer recorded, or None without such a record."""
    for name in TRINITY_LATEST_FILES:
        try:
            text = (Path(root) / name).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeError):
            continue
        if text.isdigit():
            return int(text)
    return None


def read_header(path: Path) -> tuple[TensorMetaMap, int]:
    """A safetensors file's tensors and the length it must have; CheckpointError if unreadable."""
    try:
        return parse_header(path)
    except OSError as exc:  # e.g. a trainer deleting an old checkpoint while we look
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None


def parse_header(path: Path) -> tuple[TensorMetaMap, int]:
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: shorter than a safetensors header ({size} bytes)")
        (length,) = struct.unpack("<Q", raw)
        if length > size - 8:
            raise CheckpointError(f"{path}: header says {length} bytes but the file has {size}")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise CheckpointError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors header (a JSON {type(header).__name__})")
    meta: TensorMetaMap = {}
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{path}: tensor '{name}' has an unknown dtype or a malformed entry: {info!r:.200}"
            )
        try:
            meta[name] = ([int(n) for n in info["shape"]], SAFETENSORS_DTYPES[info["dtype"]])
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise CheckpointError(
                f"{path}: tensor '{name}' has a malformed header entry: {info!r:.200}"
            ) from None
    return meta, 8 + length + end


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory, including every shard its index names.

    A shard is named relative to the directory: an index naming `../x.safetensors` or an absolute path would
    have every engine read a file the checkpoint does not hold.
    """
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: unreadable index ({type(exc).__name__}: {exc})") from None
        outside = [
            s for s in shards if not isinstance(s, str) or Path(s).is_absolute() or ".." in Path(s).parts
        ]
        if outside:
            raise CheckpointError(f"{index}: names shards outside {directory}: {outside[:3]}; refusing it")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards named in the index are missing: {missing}")
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no .safetensors files")
    return files


def weights_hash(directory: Path, cache: dict[str, Any] | None = None) -> str:
    """sha256 over the safetensors files' names and bytes (streamed), cached by each file's size and mtime.

    The one identity of a model's weights: identical weights in two directories get one hash (a copy already
    benchmarked is not run again), and the tiny-model build records it to prove itself deterministic.
    """
    files = weight_files(directory)
    stamp = []
    for path in files:
        stat = path.stat()
        stamp.append([path.name, stat.st_size, stat.st_mtime_ns])
    key = str(Path(directory).resolve())
    if cache is not None and cache.get(key, {}).get("files") == stamp:
        return cache[key]["sha256"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(HASH_CHUNK):
                digest.update(chunk)
    value = digest.hexdigest()
    if cache is not None:
        cache[key] = {"files": stamp, "sha256": value}
    return value


def tensor_meta(directory: Path) -> TensorMetaMap:
    """Every tensor of a model directory with its shape and dtype, from the headers alone."""
    meta: TensorMetaMap = {}
    for path in weight_files(directory):
        part, _ = read_header(path)
        meta.update(part)
    return meta


def check_checkpoint(directory: Path, expected: TensorMetaMap, root: Path | None = None) -> int:
    """Raise CheckpointError unless `directory` holds exactly `expected`, whole; returns its weight bytes.

    `root`: the checkpoint dir it was found in (not a path a user named). The directory and its weight files
    must then resolve inside it, so a `global_step_N` symlinked elsewhere cannot load weights from elsewhere.
    """
    directory = Path(directory)
    if root is not None:
        check_inside(directory, root)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: no config.json (not a Hugging Face model directory)")
    found: TensorMetaMap = {}
    total = 0
    for path in weight_files(directory):
        if root is not None:
            check_inside(path, root)
        meta, length = read_header(path)
        size = file_size(path)
        if size < length:
            raise CheckpointError(f"{path}: truncated: {size} bytes, its header needs {length}")
        found.update(meta)
        total += size
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"{directory}: missing {len(missing)} tensors, e.g. '{missing[0]}'")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(f"{directory}: tensors the model does not have, e.g. '{extra[0]}'")
    for name, (shape, dtype) in expected.items():
        if found[name] != (shape, dtype):
            got_shape, got_dtype = found[name]
            raise CheckpointError(
                f"{directory}: tensor '{name}' is {got_dtype}{got_shape}, the model needs {dtype}{shape}"
            )
    return total


def check_inside(path: Path, root: Path) -> None:
    try:
        resolved, inside = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, before Python 3.13
        raise CheckpointError(f"{path}: cannot be resolved ({exc}): a symlink loop?") from None
    if not resolved.is_relative_to(inside):
        raise CheckpointError(
            f"{path}: resolves to {resolved}, outside the checkpoint dir {inside}; refusing it"
        )


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None


def write_checkpoint(root: Path, step: int, state_dict: dict, base_dir: Path) -> Path:
    """Write `root/global_step_<step>/` whole or not at all: written aside, fsynced, then renamed.

    An older `global_step_<step>/` is removed first (a rename cannot replace a non-empty directory): a crash
    in between leaves no checkpoint of that step, never half of one.
    """
    from safetensors.torch import save_file  # heavy (torch), deferred: checks read headers without torch

    root = Path(root)
    final = root / checkpoint_dir_name(step)
    partial = root / partial_checkpoint_dir_name(step)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in state_dict.items()}
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    for path in Path(base_dir).iterdir():
        if path.is_file() and (path.name in SIDE_FILES or path.suffix in SIDE_SUFFIXES):
            shutil.copy2(path, partial / path.name)
    if final.exists():
        shutil.rmtree(final)
    atomic_replace(partial, final)
    return final
