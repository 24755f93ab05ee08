"""Hugging Face dataset folders as tasksets: a subset and a split resolved to data files, read like any other.

Trinity-RFT's tasksets name a dataset with `path`, `subset_name` and `split`. Here `path` must be a local
folder (nothing is downloaded), either:
- a dataset repository as the hub stores it (parquet or jsonl files, e.g. `main/train-00000-of-00001.parquet`,
  with or without the README's `configs:`), resolved by the `datasets` library's own data-file rules; a subset
  the README does not declare is looked for as a folder of that name;
- a `save_to_disk` folder (`dataset_dict.json` with one folder per split, or one split's `state.json`).

Only the file list comes from `datasets`: the files are then streamed by `operators.tasks.reader` in bounded
memory, so errors still name the file, row and field, and nothing is copied into the `datasets` cache.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from schemas.errors import InputError

READABLE = (".parquet", ".jsonl", ".json", ".arrow")
DOWNLOAD_HINT = (
    "it is not a local folder, and rftflow downloads nothing: fetch it first, e.g. `huggingface-cli download "
    "--repo-type dataset {name} --local-dir {local}`, and give that folder as the path"
)


def is_dataset_dir(path: Path) -> bool:
    """A `save_to_disk` folder (a DatasetDict or one Dataset), which only `datasets` lays out this way."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())


def dataset_files(path: Path, subset: str | None, split: str | None) -> list[Path]:
    """The data files of `split` (default `train`) of `subset` in the dataset folder `path`."""
    if not path.exists():  # its last two parts as the hub id: a config's relative path is read as absolute
        name = "/".join(path.parts[-2:])
        local = Path("datasets") / name.replace("/", "__")
        raise InputError(DOWNLOAD_HINT.format(name=name, local=local), file=str(path))
    if not path.is_dir():
        raise InputError("a Hugging Face dataset (subset_name/split given) must be a folder", file=str(path))
    split = split or "train"
    files = saved_files(path, split) if is_dataset_dir(path) else repository_files(path, subset, split)
    for file in files:
        if file.suffix not in READABLE:
            raise InputError(
                f"data file format '{file.suffix}' is not read (use {', '.join(READABLE)})", file=str(file)
            )
    if not files:
        raise InputError(f"split {split!r} has no data files", file=str(path), field="split")
    return files


def saved_files(path: Path, split: str) -> list[Path]:
    """A `save_to_disk` folder's Arrow files for `split`, in the order `datasets` wrote them."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        if split not in splits:
            raise InputError(
                f"no split {split!r} (it has: {', '.join(splits)})", file=str(path), field="split"
            )
        path = path / split
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    return [path / entry["filename"] for entry in state.get("_data_files", [])]


def repository_files(path: Path, subset: str | None, split: str) -> list[Path]:
    """A hub-style dataset folder's files for (subset, split), by `datasets`' own resolution rules."""
    import datasets  # heavy (0.6 s), deferred: only Hugging Face tasksets need it

    with tempfile.TemporaryDirectory() as cache:  # its lock files go here, not into the user's cache
        try:
            builder = datasets.load_dataset_builder(str(path), name=subset, cache_dir=cache)
        except ValueError as exc:
            if subset is None or not (path / subset).is_dir():
                raise InputError(
                    f"not a readable dataset folder: {exc}", file=str(path), field="subset_name"
                ) from None
            builder = datasets.load_dataset_builder(str(path), data_dir=subset, cache_dir=cache)
        except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
            raise InputError(f"not a readable dataset folder: {exc}", file=str(path)) from None
        found = {str(name): list(files) for name, files in (builder.config.data_files or {}).items()}
    if split not in found:
        raise InputError(
            f"no split {split!r} (it has: {', '.join(found) or 'none'})", file=str(path), field="split"
        )
    return [Path(file) for file in found[split]]
