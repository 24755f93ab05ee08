"""Eval metrics over a task's samples: pass@k (unbiased estimator) and mean@k.

With n samples of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k): the chance that at least one of k
samples drawn without replacement from the n is correct (Chen et al. 2021). mean@k, the expected mean score
of k such samples, is estimated without bias by the mean over all n, whatever k.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n} (the number of samples), got {k}")


def pass_at_k(correct: Sequence[bool], k: int) -> float:
    """Probability that at least one of k of these samples is correct."""
    n, c = len(correct), sum(map(bool, correct))
    check_k(n, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_at_k(scores: Sequence[float], k: int) -> float:
    """Expected mean score of k of these samples (k only bounds what the samples can estimate)."""
    check_k(len(scores), k)
    return sum(map(float, scores)) / len(scores)
