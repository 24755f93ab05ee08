"""The first home of `register_reward` (`from operators.rewards import register_reward`), kept so that plugins
written against it still load. Every name here is a DeprecationWarning naming its import from
`operators.workflows`, the one module a plugin imports from."""

from operators.rollout.moved import moved_names

__getattr__ = moved_names(
    "operators.rewards",
    {
        "register_reward": "operators.workflows",
        "get_reward_fn": "operators.workflows",
        "RewardFn": "operators.workflows",
        "math_accuracy": "operators.rollout.rewards",
        "format_reward": "operators.rollout.rewards",
        "math_boxed_accuracy": "operators.rollout.rewards",
        "countdown": "operators.rollout.rewards",
    },
)
