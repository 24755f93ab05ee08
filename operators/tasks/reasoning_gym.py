"""reasoning-gym datasets as tasksets: procedural tasks generated on the fly, no download, no file.

A taskset with `reasoning_gym: {dataset, args, size, seed}` is one source of `size` rows, named
`reasoning_gym:<dataset>` in errors and plans. reasoning-gym derives entry i from the seed and i alone, so the
same config gives the same tasks, and a resumed run reads on from where it stopped, as with a file. Each row's
`info` holds what the family's scorer needs (`operators.rollout.reasoning_gym_reward`): the dataset, its args
and the entry's metadata. reasoning-gym (about 1 s to import) is imported only for such tasksets.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from schemas.buffer_config import FormatConfig, ReasoningGymConfig
from schemas.errors import InputError

SOURCE_PREFIX = "reasoning_gym:"
INSTALL_HINT = "reasoning-gym is not installed: `pip install rftflow[tasks]` (or `pip install reasoning-gym`)"
RESERVED_ARGS = ("seed", "size")  # given as reasoning_gym.seed and .size, so the config has one place each


def source_name(cfg: ReasoningGymConfig) -> str:
    """How the source is named where a file would be: in the plan, errors and block metadata."""
    return f"{SOURCE_PREFIX}{cfg.dataset}"


def import_reasoning_gym() -> Any:
    try:
        import reasoning_gym  # heavy (about 1 s), deferred: only reasoning-gym tasksets and rewards need it
    except ImportError:
        raise InputError(INSTALL_HINT, field="reasoning_gym") from None
    return reasoning_gym


def make_dataset(cfg: ReasoningGymConfig) -> Any:
    """The configured reasoning-gym dataset, or an InputError naming the field at fault."""
    rg = import_reasoning_gym()
    source = source_name(cfg)
    known = sorted(rg.factory.DATASETS)
    if cfg.dataset not in known:
        close = difflib.get_close_matches(cfg.dataset, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"{len(known)} are known, e.g. {known[0]}"
        raise InputError(
            f"no such reasoning-gym dataset ({hint})", file=source, field="reasoning_gym.dataset"
        )
    if reserved := [name for name in RESERVED_ARGS if name in cfg.args]:
        raise InputError(
            f"give {' and '.join(reserved)} as reasoning_gym.{reserved[0]}, not in args",
            file=source,
            field="reasoning_gym.args",
        )
    try:
        return rg.create_dataset(cfg.dataset, **cfg.args, seed=cfg.seed, size=cfg.size)
    except (TypeError, ValueError, AssertionError, KeyError) as exc:  # unknown keys; its own validate()
        raise InputError(
            f"bad generation arguments for {cfg.dataset}: {exc or type(exc).__name__}",
            file=source,
            field="reasoning_gym.args",
        ) from None


def task_info(cfg: ReasoningGymConfig, entry: dict[str, Any]) -> dict[str, Any]:
    """What the family's scorer needs besides the response: it is rebuilt from the dataset and args."""
    return {"dataset": cfg.dataset, "dataset_args": cfg.args, "metadata": entry.get("metadata", {})}


def generated_rows(
    cfg: ReasoningGymConfig, fmt: FormatConfig, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any] | InputError]]:
    """(row number from 1, record) pairs, records keyed as the taskset's format reads them, like a file's
    rows: an entry that cannot be generated raises, or with `skip_bad` comes out as its InputError. A family
    with no single answer (its scorer checks the response itself, e.g. `rubiks_cube`) has an empty truth."""
    dataset = make_dataset(cfg)
    for index in range(cfg.size):
        try:
            entry = dataset[index]
        except Exception as exc:  # a generator failing on these args at this index: a bad row, located
            error = InputError(
                f"reasoning-gym could not generate it: {exc!r:.200}",
                file=source_name(cfg),
                row=index + 1,
                field="reasoning_gym.args",
            )
            if not skip_bad:
                raise error from None
            yield index + 1, error
            continue
        answer = entry.get("answer")
        record = {fmt.prompt_key: entry.get("question"), fmt.response_key: "" if answer is None else answer}
        if fmt.info_key:
            record[fmt.info_key] = task_info(cfg, entry)
        yield index + 1, record
