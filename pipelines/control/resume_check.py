"""A resumed run must be the same run: its config is compared with the one in its `config.yaml`.

Every config field is either *identity* (it changes which tasks fall in which step, or the policy and
procedure that produce their experiences: tasksets, batch size, epochs, repeats, seeds and sampling, the
workflow and reward, the model) or *free* (how long to run, how often to evaluate, logging, timeouts, the
engine count). Each schema model lists its free fields in `free_on_resume`; an unmarked field counts as
identity, so a new field is safe until someone decides otherwise. A resume that changes an identity key
would put experiences of another procedure under committed keys, so it is refused naming each key with its
old and new value; a changed free key is allowed and logged.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from schemas.config import Config, flatten, load_config
from schemas.errors import InputError
from schemas.run_dir import CONFIG
from schemas.storage import Location, as_location, display, fetched, is_file, join

log = logging.getLogger(__name__)


def is_free(key: str, model: type[BaseModel] = Config) -> bool:
    """Whether dotted `key` is marked free in the schema (a key inside a mapping takes its field's mark)."""
    head, _, rest = key.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if head in getattr(model, "free_on_resume", frozenset()):
        return True
    annotation = field.annotation
    if rest and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return is_free(rest, annotation)
    return False


def saved_config(run_dir: Location) -> Config | None:
    """The config a run was started with, or None for a run dir without one (nothing to compare)."""
    path = join(as_location(run_dir), CONFIG)
    if not is_file(path):
        return None
    try:  # through load_config: a `${oc.env:NAME}` the run wrote in place of a value is read again
        with fetched(path) as local:
            return load_config(local)
    except InputError as exc:
        reason = f"{exc.field}: {exc.reason}" if exc.field else exc.reason
        raise InputError(
            f"the run's saved config is unreadable ({reason}); restore it, or use a new --run-dir",
            file=display(path),
        ) from None


def changed_keys(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs, in the schema's order."""
    before, after = flatten(old), flatten(new)
    keys = list(dict.fromkeys([*before, *after]))
    missing = "(unset)"
    return [(k, before.get(k, missing), after.get(k, missing)) for k in keys if before.get(k) != after.get(k)]


def check_resume(cfg: Config, run_dir: Location) -> None:
    """Refuse a resume whose identity keys differ from the run's saved config; log the free ones."""
    old = saved_config(run_dir)
    if old is None:
        return
    changes = changed_keys(old, cfg)
    identity = [c for c in changes if not is_free(c[0])]
    if identity:
        listed = "; ".join(f"{key}: {was} -> {now}" for key, was, now in identity)
        raise InputError(
            f"this run was started with another config, and resuming it would change what its steps hold "
            f"({listed}). Set them back, or use a new --run-dir",
            file=display(join(as_location(run_dir), CONFIG)),
        )
    for key, was, now in changes:
        log.info("resume: %s changed from %s to %s", key, was, now)
