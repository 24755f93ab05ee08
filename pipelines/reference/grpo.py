"""A minimal GRPO trainer over explorer experience tables, small enough to run the tiny policy on CPU.

GRPO replaces a learned value baseline with the other samples of the same task: each sample's advantage is
its reward standardised within its `task_uid` group, and the policy is updated with the PPO-clip objective
against the logprobs recorded at sampling time. When the explorer's experience ops wrote an `advantage`
(`grpo_advantage`, `rloo_advantage`, a plugin's), that one is used; otherwise it is computed here, by the same
function the `grpo_advantage` op uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from operators.ops.advantage import grpo_advantages
from operators.ops.groups import groups_of
from schemas.experience import MalformedExperience


@dataclass
class GRPOConfig:
    """Knobs for one GRPO update; defaults suit the tiny bundled policy."""

    lr: float = 2e-4
    clip_eps: float = 0.2
    micro_batch: int = 16
    max_grad_norm: float = 1.0
    epochs_per_step: int = 1


def advantages_for(experiences: pa.Table, eps: float = 1e-6) -> torch.Tensor:
    """Per row: the explorer's `advantage` where it wrote one, else GRPO's group advantage of the row's run.

    A lone run or a group whose rewards all agree carries no preference between responses, so it gets
    exactly 0 (`operators.ops.advantage`); a multi-turn run's segments share their run's advantage.
    """
    groups = groups_of(experiences)
    computed = groups.rows(grpo_advantages(groups, eps=eps))
    given = experiences.column("advantage").to_numpy(zero_copy_only=False).astype(np.float64)
    return torch.tensor(np.where(np.isnan(given), computed, given), dtype=torch.float32)


def zero_advantage_groups(experiences: pa.Table, advantages: torch.Tensor) -> tuple[int, int]:
    """(groups whose every sample has advantage 0, groups): the tasks the update learns nothing from."""
    groups = groups_of(experiences)
    nonzero = np.zeros(groups.num_tasks, bool)
    np.logical_or.at(nonzero, groups.task_of_run[groups.run_of_row], advantages.numpy() != 0.0)
    return int((~nonzero).sum()), groups.num_tasks


def make_batch(
    prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+response rows with their attention mask and response mask.

    response_mask is 1 where the token *at* that position is a response token, which lines up with
    `token_logprobs` (position t holds log p(token t | tokens < t)). A response needs a non-empty prompt
    in front of it, since the first token of a sequence is never predicted.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
    if any(not p for p in prompt_ids):
        raise ValueError("empty prompt: the first response token would have no logprob")
    width = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids, strict=True))
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    response_mask = torch.zeros((len(prompt_ids), width), dtype=torch.float32)
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        end = len(prompt) + len(response)
        input_ids[row, :end] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
        attention_mask[row, :end] = 1
        response_mask[row, len(prompt) : end] = 1.0
    return input_ids, attention_mask, response_mask


def token_logprobs_and_entropy(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token t | tokens < t) and the entropy of the distribution it was drawn from (no gradient), for
    every position, 0 at position 0, in the layout of `input_ids`."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    detached = logprobs.detach()
    entropy = -(detached.exp() * detached).sum(dim=-1)
    first = picked.new_zeros((input_ids.shape[0], 1))
    return torch.cat([first, picked], dim=1), torch.cat([first.detach(), entropy], dim=1)


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for every position, 0 at position 0, in the layout of `input_ids`."""
    return token_logprobs_and_entropy(model, input_ids, attention_mask)[0]


def kl_estimate(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per token, KL(policy || reference) estimated from the sampled token alone (the "k3" estimator,
    exp(d) - d - 1 with d = reference - policy logprob): unbiased for on-policy samples, never negative."""
    d = reference - logprobs
    return torch.exp(d) - d - 1.0


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss, averaged over each sequence's response tokens and then over sequences.

    Averaging per sequence first keeps long responses from outweighing short ones of the same group.
    clip_frac counts response tokens whose gradient the clip cuts off (the clipped term is the binding one).
    """
    ratio = torch.exp(new_logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    token_loss = -torch.minimum(unclipped, clipped)
    tokens_per_seq = response_mask.sum(dim=1).clamp(min=1.0)
    loss = ((token_loss * response_mask).sum(dim=1) / tokens_per_seq).mean()
    n_tokens = response_mask.sum().clamp(min=1.0)
    with torch.no_grad():
        clip_frac = ((clipped < unclipped).float() * response_mask).sum() / n_tokens
        ratio_mean = (ratio * response_mask).sum() / n_tokens
    return loss, {"clip_frac": clip_frac.item(), "ratio_mean": ratio_mean.item()}


def make_optimizer(model: nn.Module, cfg: GRPOConfig) -> torch.optim.AdamW:
    """AdamW without weight decay: decay would drag the pretrained policy toward zero regardless of reward."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)


def _old_logprobs(
    logprobs: list[list[float]], prompt_lens: list[int], shape: tuple[int, int]
) -> torch.Tensor:
    """Sampling-time logprobs placed at the response positions of the batch (0 elsewhere)."""
    old = torch.zeros(shape, dtype=torch.float32)
    for row, (lps, start) in enumerate(zip(logprobs, prompt_lens, strict=True)):
        old[row, start : start + len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return old


@dataclass
class Batch:
    """The rows trained on, laid out for the model: ids, masks, sampling-time logprobs and advantages."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor  # response tokens the policy sampled (prompt, padding, inserted text: 0)
    old_logprobs: torch.Tensor
    advantages: torch.Tensor


def training_batch(rows: pa.Table, advantages: torch.Tensor, pad_id: int, row_ids: list[int]) -> Batch:
    """`rows` as a `Batch`; logprobs that do not line up with their response are refused (named by row)."""
    prompts = rows.column("prompt_ids").to_pylist()
    responses = rows.column("response_ids").to_pylist()
    sampled = rows.column("logprobs").to_pylist()
    for i, (response, lps) in enumerate(zip(responses, sampled, strict=True)):
        if len(lps) != len(response):
            raise MalformedExperience(
                f"row {row_ids[i]}: {len(lps)} logprobs for {len(response)} response tokens"
            )
    input_ids, attention_mask, response_mask = make_batch(prompts, responses, pad_id)
    prompt_lens = [len(p) for p in prompts]
    for row, (start, acts) in enumerate(
        zip(prompt_lens, rows.column("action_mask").to_pylist(), strict=True)
    ):
        response_mask[row, start : start + len(acts)] *= torch.tensor(acts, dtype=torch.float32)
    old = _old_logprobs(sampled, prompt_lens, tuple(input_ids.shape))
    return Batch(input_ids, attention_mask, response_mask, old, advantages)


def train_on_experiences(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    experiences: pa.Table,
    cfg: GRPOConfig,
    pad_id: int,
    reference: nn.Module | None = None,
) -> dict[str, float]:
    """One GRPO update on an experience table: one optimizer step per epoch, gradients accumulated over
    micro-batches so the result does not depend on `cfg.micro_batch`.

    Samples with zero advantage are dropped: they contribute no gradient, only compute. Response tokens
    with a false `action_mask` (text the policy did not generate) are not trained on. `train/entropy` and,
    given the starting weights as `reference`, `train/kl_to_start` are measured on the trained samples'
    response tokens by the first epoch's forward passes, i.e. at the weights before this update.
    """
    rewards = experiences.column("reward").to_pylist()
    advantages = advantages_for(experiences)
    keep = [i for i, a in enumerate(advantages.tolist()) if a != 0.0]
    zero_groups, groups = zero_advantage_groups(experiences, advantages)
    metrics = {
        "train/loss": 0.0,
        "train/clip_frac": 0.0,
        "train/grad_norm": 0.0,
        "train/samples": float(len(keep)),
        "train/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "train/zero_adv_groups": float(zero_groups),
        "train/groups": float(groups),
        "train/lr": float(optimizer.param_groups[0]["lr"]),
    }
    if not keep:
        model.eval()
        return metrics
    batch = training_batch(experiences.take(keep), advantages[keep], pad_id, keep)
    model.train()
    try:
        metrics.update(update(model, optimizer, batch, cfg, reference))
    finally:
        model.eval()
    return metrics


def update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: GRPOConfig,
    reference: nn.Module | None,
) -> dict[str, float]:
    """The epochs of one update; returns the loss, clip fraction and gradient norm (epoch means), and the
    entropy and KL to `reference` per response token at the weights it started from."""
    n = len(batch.input_ids)
    totals = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
    measured = {"entropy": 0.0, "kl_to_start": 0.0}
    n_tokens = batch.response_mask.sum().clamp(min=1.0).item()
    for epoch in range(cfg.epochs_per_step):
        optimizer.zero_grad(set_to_none=True)
        for lo in range(0, n, cfg.micro_batch):
            part = slice(lo, min(lo + cfg.micro_batch, n))
            ids, attention, mask = (
                batch.input_ids[part],
                batch.attention_mask[part],
                batch.response_mask[part],
            )
            new, entropy = token_logprobs_and_entropy(model, ids, attention)
            loss, stats = policy_loss(
                new, batch.old_logprobs[part], batch.advantages[part], mask, cfg.clip_eps
            )
            # policy_loss averages over its micro-batch; weighting by its share of sequences makes the
            # accumulated gradient that of the mean over all sequences.
            share = len(ids) / n
            (loss * share).backward()
            totals["loss"] += loss.item() * share
            totals["clip_frac"] += stats["clip_frac"] * mask.sum().item() / n_tokens
            if epoch == 0:
                measured["entropy"] += (entropy * mask).sum().item() / n_tokens
                if reference is not None:
                    with torch.no_grad():
                        start = token_logprobs(reference, ids, attention)
                    kl = kl_estimate(new.detach(), start)
                    measured["kl_to_start"] += (kl * mask).sum().item() / n_tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        totals["grad_norm"] += float(grad_norm)
        optimizer.step()
    if reference is None:
        del measured["kl_to_start"]
    return {
        **{f"train/{name}": total / cfg.epochs_per_step for name, total in totals.items()},
        **{f"train/{name}": value for name, value in measured.items()},
    }
