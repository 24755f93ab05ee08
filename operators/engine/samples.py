"""What a generate call returns, and how a sample grows when a weight sync cuts it (partial rollout).

With `synchronizer.partial_rollout`, a swap aborts the requests in flight instead of waiting for them; each
sample cut that way keeps its tokens and logprobs so far, and goes on under the new weights from the prompt
plus those tokens. `token_versions` says which version sampled each token, and the generation's
`model_version` is the oldest of them: staleness is judged on the oldest token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CUT = "abort"  # vLLM's finish reason for an aborted request


@dataclass
class Sample:
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    token_versions: list[int] | None = None  # None: every token sampled at the generation's model_version


@dataclass
class Generation:
    """One request's result: the prompt as the engine saw it and `n` samples, stamped at dispatch (with
    partial rollout: the oldest version any sampled token came from)."""

    prompt_ids: list[int]
    prompt_text: str
    model_version: int
    samples: list[Sample]

    def as_dict(self) -> dict[str, Any]:
        """What `dataclasses.asdict` gives, without its deep copy of every id and logprob list: the answer
        of a Ray call, serialised at once (the deep copy was 4.5% of the engine actor's CPU)."""
        return {**vars(self), "samples": [dict(vars(sample)) for sample in self.samples]}


def choice_tokens(choice: Any) -> tuple[list[int], list[float]]:
    """The sampled ids of a vLLM `CompletionOutput`, with each one's logprob."""
    ids = list(choice.token_ids)
    lps = [entry[token].logprob for token, entry in zip(ids, choice.logprobs or [], strict=True)]
    return ids, lps


@dataclass
class Draft:
    """One sample as it grows across requests: what each piece sampled, and with which version."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = CUT
    text: str = ""
    pieces: int = 0

    def add(self, choice: Any | None, version: int) -> None:
        """Append a request's output for this sample (None: cut before it sampled anything)."""
        self.pieces += 1
        if choice is None:
            self.finish_reason = CUT
            return
        ids, lps = choice_tokens(choice)
        self.ids += ids
        self.logprobs += lps
        self.versions += [version] * len(ids)
        self.finish_reason, self.text = str(choice.finish_reason), choice.text

    @property
    def cut(self) -> bool:
        return self.finish_reason == CUT

    def rest(self, sampling: dict[str, Any], index: int) -> dict[str, Any] | None:
        """Sampling params for the rest of this sample (one sample, the tokens left), or None when its budget
        is spent. A seeded request stays reproducible: the seed is derived from the base, the sample and the
        length so far, so the rest is not sampled with the random stream the beginning used."""
        left = int(sampling.get("max_tokens") or 16) - len(self.ids)
        if left <= 0:
            self.finish_reason = "length"
            return None
        seed = sampling.get("seed")
        if seed is not None:
            seed = (seed + 7919 * (index + 1) + 104729 * len(self.ids)) & 0x7FFFFFFF
        return {**sampling, "n": 1, "max_tokens": left, "seed": seed}

    def sample(self, text: str | None = None) -> Sample:
        """The finished sample; `text`: the whole response decoded, for one sampled in several pieces."""
        versions = self.versions if self.pieces > 1 else None
        return Sample(
            self.ids, self.logprobs, self.finish_reason, self.text if text is None else text, versions
        )
