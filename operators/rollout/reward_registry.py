"""The reward-function registry: built-ins and plugins register `fn(response, truth, **args)` by name.

A reward function returns `{"reward": r, <part>: value, ...}` with r in [0, 1]. One that declares an `info`
parameter also gets the task's `info` (its row's own data, e.g. a reasoning-gym entry's metadata); the others
are called as they always were, so two-argument functions keep working. The registry lives apart
from the built-in functions (`operators.rollout.rewards`) so that a lookup can load the built-ins on first
use, as the workflow and op registries do, and so that the built-ins' module is not where plugins register.
Plugins import `register_reward` from `operators.workflows`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from operators.rollout.registration import import_all, lookup, register_once
from schemas.task import Task

RewardFn = Callable[..., dict[str, float]]
REWARD_FNS: dict[str, RewardFn] = {}
WARM_UPS: list[Callable[[], None]] = []  # heavy imports the built-ins defer, made by `warm_up_rewards`
BUILTIN_MODULES = ("operators.rollout.rewards", "operators.rollout.reasoning_gym_reward")


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """A decorator registering a reward function under `name` (once; re-importing the same one is fine)."""

    def wrap(fn: RewardFn) -> RewardFn:
        register_once(REWARD_FNS, "reward function", name, fn)
        return fn

    return wrap


def register_warm_up(fn: Callable[[], None]) -> Callable[[], None]:
    """A decorator: `fn` is called by `warm_up_rewards` (a built-in's deferred heavy import, say)."""
    WARM_UPS.append(fn)
    return fn


def warm_up_rewards() -> None:
    """The built-ins loaded and their deferred heavy imports made now. A forwarding actor calls this as it
    starts, while the engines load, so that the first step's first reward does not pay them (math-verify's
    import took 0.5 s of the forwarder's CPU, half of the pipeline's own CPU in a 1,024-task run)."""
    import_all(BUILTIN_MODULES)
    for warm_up in WARM_UPS:
        warm_up()


def get_reward_fn(name: str) -> RewardFn:
    """The reward function registered as `name` (built-ins loaded first), or a KeyError naming the known."""
    import_all(BUILTIN_MODULES)
    return lookup(REWARD_FNS, "reward function", name)


@functools.cache
def takes_info(fn: RewardFn) -> bool:
    """Whether `fn` declares an `info` parameter (a callable without a signature is taken not to)."""
    try:
        return "info" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def call_reward(fn: RewardFn, response: str, task: Task) -> dict[str, float]:
    """`fn`'s verdict on `response` to `task`: with its reward_fn_args, and its info if `fn` takes it."""
    info = {"info": task.info} if takes_info(fn) else {}
    return fn(response, task.truth, **task.reward_fn_args, **info)
