"""The transforms and defaults the Trinity-RFT key table (`schemas.trinity_keys`) names: each turns one
Trinity key's value into rftflow's, reading the other keys its meaning depends on, as Trinity's validator
does.

Where the two systems' defaults differ, Trinity-RFT's apply (Trinity's configs were written against them).
"""

from __future__ import annotations

from typing import Any

from schemas.selector_config import BUILTIN_SELECTORS
from schemas.trinity_rules import Default, Transform, Translation

MODES_REFUSED = {"train": "the trainer is yours", "colocate": "colocated training"}
WORKFLOWS = {"math_workflow": "math", "math_boxed_workflow": "math_boxed"}
REWARDS = {
    "math_reward": "math_accuracy",
    "accuracy_reward": "math_accuracy",
    "format_reward": "format",
    "math_boxed_reward": "math_boxed_accuracy",
    "countdown_reward": "countdown",
}
SYNC_METHODS = {
    "nccl": "broadcast",
    "online": "broadcast",
    "checkpoint": "checkpoint",
    "offline": "checkpoint",
}
SYNC_METHODS["memory"] = "memory"
SYNC_STYLES = {"trainer_driven": "dynamic_by_trainer", "explorer_driven": "dynamic_by_explorer"}
# The reference's reward filters, as (op, argument its `threshold` becomes): both keep what they kept there.
OPERATORS = {
    "reward_filter": ("reward_filter", "min_reward"),
    "reward_std_filter": ("reward_std_filter", "threshold"),
}


def parent(where: str) -> str:
    return where.rpartition(".")[0]


def value_of(default: Any) -> Default:
    """Trinity's default where it differs from rftflow's."""
    return lambda t, where: default


def from_key(dotted: str) -> Default:
    """The value of another Trinity key (a section-wide default, say)."""
    return lambda t, where: t.get(dotted)


def renamed(names: dict[str, str]) -> Transform:
    """Trinity's registered name turned into rftflow's; other names pass as they are."""
    return lambda value, t, where: names.get(value, value)


def repeat_times(t: Translation, where: str) -> int:
    """`algorithm.repeat_times` for the taskset; 1 for an eval taskset, Trinity's default there."""
    return 1 if ".eval_tasksets." in where else t.get("algorithm.repeat_times", 1)


def mode(value: str, t: Translation, where: str) -> str | None:
    if value in MODES_REFUSED:
        t.refuse(where, f"mode {value} ({MODES_REFUSED[value]}) is not an explorer run")
    if value not in ("explore", "both", "bench", "serve"):
        t.refuse(where, f"unknown mode {value!r}")
    if value == "both":
        t.notice("mode both: the explorer side runs here; the trainer is yours (or --with-trainer)")
    return value if value in ("bench", "serve") else None


def serve_key(target: str) -> Transform:
    """A key of Trinity's serve mode, to `target` (an rftflow key) in a `mode: serve` config; ignored, with a
    notice, in any other mode."""

    def transform(value: Any, t: Translation, where: str) -> None:
        if t.get("mode", "both") != "serve":
            t.notice(f"{where}: ignored (serve mode only)")
            return
        t.put(target, value)

    return transform


def checkpoint_dir(value: str, t: Translation, where: str) -> str:
    """Trinity's job dir: the root joined with the project and the run name."""
    return f"{value}/{t.get('project', 'Trinity-RFT')}/{t.get('name', 'rft')}"


def ray_address(value: str, t: Translation, where: str) -> str | None:
    return None if value == "auto" else value


def lengths(t: Translation) -> dict[str, int | None]:
    """`model.max_model_len`, `max_prompt_tokens` and `max_response_tokens` as Trinity's validator settles
    them: the length is prompt + response when unset; with neither cap set each gets half of it; with one,
    that one is clamped below the length and the other gets the rest. Where Trinity cannot tell the length (it
    refuses), rftflow's default stands and the caps pass as given."""
    total, prompt, response = (
        t.get(f"model.{k}") for k in ("max_model_len", "max_prompt_tokens", "max_response_tokens")
    )
    if total is None:
        if prompt is None or response is None:
            return {"max_model_len": None, "max_prompt_tokens": prompt, "max_response_tokens": response}
        total = prompt + response
    elif prompt is not None and response is not None and prompt + response > total:
        t.refuse(
            "model.max_model_len",
            f"max_prompt_tokens + max_response_tokens ({prompt} + {response}) exceed it ({total})",
        )
    if prompt is None and response is None:
        prompt = total // 2
        response = total - prompt
    elif prompt is None:
        response = min(response, total - 1)
        prompt = total - response
    elif response is None:
        prompt = min(prompt, total - 1)
        response = total - prompt
    return {"max_model_len": total, "max_prompt_tokens": prompt, "max_response_tokens": response}


def length(name: str, *also: str) -> Transform:
    """One of the three lengths, after Trinity's rules; a notice for it (and for `also`, lengths no transform
    of their own settles) where the rules changed or filled it."""

    def settle(value: Any, t: Translation, where: str) -> int | None:
        settled = lengths(t)
        for key in (name, *also):
            if settled[key] is not None and settled[key] != t.get(f"model.{key}"):
                t.notice(f"model.{key}: {settled[key]}, by Trinity's length rules")
        return settled[name]

    return settle


def response_tokens(t: Translation, where: str) -> int | None:
    return lengths(t)["max_response_tokens"]


def selector(value: str, t: Translation, where: str) -> str:
    """A selector rftflow has under Trinity's name; any other (a Trinity plugin's) is refused, naming it."""
    if value not in BUILTIN_SELECTORS:
        t.refuse(where, f"selector_type {value!r} is not one rftflow has ({', '.join(BUILTIN_SELECTORS)})")
    return value


def reject_taskset_storage(value: str, t: Translation, where: str) -> None:
    if value != "file":
        t.refuse(where, f"a {value} taskset (rftflow reads jsonl and Parquet files)")


def is_sql(node: dict[str, Any]) -> bool:
    """The reference's queue with a database URL (or a SQL buffer): its SQL copy is rftflow's SQL buffer."""
    storage, path = node.get("storage_type"), node.get("path")
    return storage == "sql" or storage == "queue" and isinstance(path, str) and "://" in path


def experience_storage(value: str | None, t: Translation, where: str) -> str | None:
    if is_sql(t.get(parent(where), {})):
        return "sql"
    if value not in ("queue", "file", None):
        t.refuse(where, f"storage {value!r}, which rftflow's explorer does not write")
    t.notice(f"{where} {value}: written as Parquet step folders in the run dir")
    return None


def sql_only(value: Any, t: Translation, where: str) -> Any:
    """A buffer's path or name: rftflow's SQL buffer takes them; its Parquet one lives in the run dir."""
    return value if is_sql(t.get(parent(where), {})) else None


def sync_method(value: str, t: Translation, where: str) -> str:
    if value not in SYNC_METHODS:
        t.refuse(where, f"unknown method {value!r}")
    native = SYNC_METHODS[value]
    if native == "broadcast":  # only the explorer runs here: Trinity-RFT syncs by checkpoint then
        t.notice(f"{where} {value}: checkpoint, as Trinity-RFT's explore mode")
        return "checkpoint"
    return native


def sync_style(value: str, t: Translation, where: str) -> str:
    if value == "fully_async":
        t.refuse(where, "fully_async (rftflow has fixed, dynamic_by_explorer and dynamic_by_trainer)")
    return SYNC_STYLES.get(value, value)


def monitor_type(value: str, t: Translation, where: str) -> None:
    if value != "mlflow":
        t.notice(f"{where} {value}: rftflow tracks in MLflow")


def mlflow_uri(value: dict[str, Any], t: Translation, where: str) -> str | None:
    """`monitor_args` is free-form there; rftflow reads its `uri` when the monitor is MLflow."""
    if not isinstance(value, dict):
        t.refuse(where, f"expected a mapping, got {type(value).__name__}")
    return value.get("uri") if t.get("monitor.monitor_type", "mlflow") == "mlflow" else None


def operator_name(value: str, t: Translation, where: str) -> str:
    """Only Trinity-RFT's two reward filters: any other operator would write different experiences."""
    if value not in OPERATORS:
        t.refuse(parent(where), f"experience operator {value!r} changes what is written")
    return OPERATORS[value][0]


def operator_args(value: dict[str, Any] | None, t: Translation, where: str) -> dict[str, Any]:
    name = t.get(f"{parent(where)}.name")
    if not isinstance(value, dict | None):
        t.refuse(where, f"expected a mapping, got {type(value).__name__}")
    args = dict(value or {})
    threshold = args.pop("threshold", 0.0)
    if args:
        t.refuse(where, f"{name} arguments {sorted(args)} (only threshold)")
    return {OPERATORS[name][1]: threshold}


def model_default(key: str) -> Default:
    """A sampling setting given model-wide: each taskset's unless the taskset sets its own."""
    return lambda t, where: t.get(f"model.{key}")


def api_key(value: str, t: Translation, where: str) -> str | None:
    """Trinity's "EMPTY" is the OpenAI client's placeholder for no key."""
    return None if value == "EMPTY" else value
