"""`eval_math`: the eval-time math workflow; each experience's metrics carry its `accuracy`.

The caller groups a task's experiences and summarises them with `pipelines.control.metrics.eval_metrics`
(mean@k, pass@k) over `[e.metrics["accuracy"] for e in experiences]`.
"""

from __future__ import annotations

from operators.engine.samples import Sample
from operators.workflows.base import register_workflow
from operators.workflows.single_turn import SingleTurnWorkflow


@register_workflow("eval_math")
class EvalMathWorkflow(SingleTurnWorkflow):
    """Like `math`; accuracy is the reward's `accuracy` part, else the reward itself."""

    def metrics(self, sample: Sample, parts: dict[str, float], reward: float) -> dict[str, float]:
        return {**super().metrics(sample, parts, reward), "accuracy": float(parts.get("accuracy", reward))}
