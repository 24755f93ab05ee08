"""The reward-function registry: built-ins and plugins register `fn(response, truth, **args)` by name.

A reward function returns `{"reward": r, <part>: value, ...}` with r in [0, 1]. The registry lives apart
from the built-in functions (`operators.rollout.rewards`) so that a lookup can load the built-ins on first
use, as the workflow and op registries do, and so that the built-ins' module is not where plugins register.
Plugins import `register_reward` from `operators.workflows`.
"""

from __future__ import annotations

from collections.abc import Callable

from operators.rollout.registration import import_all, lookup, register_once

RewardFn = Callable[..., dict[str, float]]
REWARD_FNS: dict[str, RewardFn] = {}
BUILTIN_MODULES = ("operators.rollout.rewards",)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """A decorator registering a reward function under `name` (once; re-importing the same one is fine)."""

    def wrap(fn: RewardFn) -> RewardFn:
        register_once(REWARD_FNS, "reward function", name, fn)
        return fn

    return wrap


def get_reward_fn(name: str) -> RewardFn:
    """The reward function registered as `name` (built-ins loaded first), or a KeyError naming the known."""
    import_all(BUILTIN_MODULES)
    return lookup(REWARD_FNS, "reward function", name)
