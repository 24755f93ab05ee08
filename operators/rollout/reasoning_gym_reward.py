"""`reasoning_gym`: a reasoning-gym family's own scorer as the reward, for tasks from a reasoning-gym taskset.

The task's `info` (`operators.tasks.reasoning_gym.task_info`) names the dataset and its generation args, and
carries the entry's metadata; the scorer is that dataset's `score_answer`, built with the same args (a few
families score by their config), given the response's last `<answer>` block as reasoning-gym's own
`extract_answer` finds it. A response without one scores 0, where `math_accuracy` would read the whole text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from operators.rollout.reward_registry import register_reward
from operators.tasks.reasoning_gym import import_reasoning_gym, make_dataset
from schemas.buffer_config import ReasoningGymConfig


@functools.lru_cache(maxsize=64)
def scorer(dataset: str, args_json: str) -> Callable[[str | None, dict[str, Any]], float]:
    """The dataset's `score_answer`, built once per (dataset, args) in each process that scores."""
    cfg = ReasoningGymConfig(dataset=dataset, args=json.loads(args_json), size=1, seed=0)
    return make_dataset(cfg).score_answer


@register_reward("reasoning_gym")
def reasoning_gym_score(response: str, truth: str, info: dict[str, Any]) -> dict[str, float]:
    """The family's verdict in [0, 1] (some give partial credit); `accuracy` is 1 only for a full score.

    A scorer that raises on the answer (`prime_factorization` on words, say) scores it 0, with
    `scorer_error` 1: a malformed answer is the response's fault, and retrying the task would not mend it."""
    if "dataset" not in info:
        raise ValueError(
            "reasoning_gym scores tasks of a reasoning_gym taskset: the task's info names no dataset"
        )
    score_answer = scorer(info["dataset"], json.dumps(info.get("dataset_args", {}), sort_keys=True))
    answer = import_reasoning_gym().utils.extract_answer(response)
    entry = {"answer": truth if truth else None, "metadata": info.get("metadata", {})}
    try:
        score, error = min(1.0, max(0.0, float(score_answer(answer, entry)))), 0.0
    except Exception:  # any scorer's own parse of the answer; the task's info was checked when planned
        score, error = 0.0, 1.0
    return {"reward": score, "accuracy": float(score == 1.0), "scorer_error": error}
