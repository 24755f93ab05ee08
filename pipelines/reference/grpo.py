"""A minimal GRPO trainer over explorer experience tables, small enough to run the tiny policy on CPU.

GRPO replaces a learned value baseline with the other samples of the same task: each sample's advantage is
its reward standardised within its `task_uid` group, and the policy is updated with the PPO-clip objective
against the logprobs recorded at sampling time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import nn

from schemas.experience import MalformedExperience


@dataclass
class GRPOConfig:
    """Knobs for one GRPO update; defaults suit the tiny bundled policy."""

    lr: float = 2e-4
    clip_eps: float = 0.2
    micro_batch: int = 16
    max_grad_norm: float = 1.0
    epochs_per_step: int = 1


def group_advantages(task_uids: list[str], rewards: list[float], eps: float = 1e-6) -> torch.Tensor:
    """Reward standardised within its task group (sample std), the baseline GRPO uses instead of a critic.

    A lone sample or a group whose rewards all agree carries no preference between responses, so it gets
    exactly 0 (checked explicitly: rounding in the mean would otherwise leak tiny values divided by eps).
    """
    if len(task_uids) != len(rewards):
        raise ValueError(f"{len(task_uids)} task uids for {len(rewards)} rewards")
    members: dict[str, list[int]] = defaultdict(list)
    for i, uid in enumerate(task_uids):
        members[uid].append(i)
    r = torch.tensor(rewards, dtype=torch.float32)
    advantages = torch.zeros_like(r)
    for idx in members.values():
        group = r[idx]
        if len(idx) < 2 or bool(group.max() == group.min()):
            continue
        advantages[idx] = (group - group.mean()) / (group.std() + eps)
    return advantages


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


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for every position, 0 at position 0, in the layout of `input_ids`."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([picked.new_zeros((input_ids.shape[0], 1)), picked], dim=1)


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


def train_on_experiences(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    experiences: pa.Table,
    cfg: GRPOConfig,
    pad_id: int,
) -> dict[str, float]:
    """One GRPO update on an experience table: one optimizer step per epoch, gradients accumulated over
    micro-batches so the result does not depend on `cfg.micro_batch`.

    Samples with zero advantage are dropped: they contribute no gradient, only compute. Response tokens
    with a false `action_mask` (text the policy did not generate) are not trained on.
    """
    rewards = experiences.column("reward").to_pylist()
    advantages = group_advantages(experiences.column("task_uid").to_pylist(), rewards)
    keep = [i for i, a in enumerate(advantages.tolist()) if a != 0.0]
    reward_mean = sum(rewards) / len(rewards) if rewards else 0.0
    metrics = {
        "train/loss": 0.0,
        "train/clip_frac": 0.0,
        "train/grad_norm": 0.0,
        "train/samples": float(len(keep)),
        "train/reward_mean": reward_mean,
    }
    if not keep:
        model.eval()
        return metrics

    rows = experiences.take(keep)
    prompts = rows.column("prompt_ids").to_pylist()
    responses = rows.column("response_ids").to_pylist()
    sampled = rows.column("logprobs").to_pylist()
    for i, (response, lps) in enumerate(zip(responses, sampled, strict=True)):
        if len(lps) != len(response):
            raise MalformedExperience(
                f"row {keep[i]}: {len(lps)} logprobs for {len(response)} response tokens"
            )
    input_ids, attention_mask, response_mask = make_batch(prompts, responses, pad_id)
    prompt_lens = [len(p) for p in prompts]
    if "action_mask" in rows.column_names:
        action_masks = rows.column("action_mask").to_pylist()
        for row, (start, acts) in enumerate(zip(prompt_lens, action_masks, strict=True)):
            response_mask[row, start : start + len(acts)] *= torch.tensor(acts, dtype=torch.float32)
    old_logprobs = _old_logprobs(sampled, prompt_lens, tuple(input_ids.shape))
    advantages = advantages[keep]

    n = len(keep)
    totals = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
    n_tokens = response_mask.sum().clamp(min=1.0).item()
    model.train()
    try:
        for _ in range(cfg.epochs_per_step):
            optimizer.zero_grad(set_to_none=True)
            for lo in range(0, n, cfg.micro_batch):
                hi = min(lo + cfg.micro_batch, n)
                mask = response_mask[lo:hi]
                new = token_logprobs(model, input_ids[lo:hi], attention_mask[lo:hi])
                loss, stats = policy_loss(new, old_logprobs[lo:hi], advantages[lo:hi], mask, cfg.clip_eps)
                # policy_loss averages over its micro-batch; weighting by its share of sequences makes the
                # accumulated gradient that of the mean over all sequences.
                share = (hi - lo) / n
                (loss * share).backward()
                totals["loss"] += loss.item() * share
                totals["clip_frac"] += stats["clip_frac"] * mask.sum().item() / n_tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            totals["grad_norm"] += float(grad_norm)
            optimizer.step()
    finally:
        model.eval()
    for name, total in totals.items():
        metrics[f"train/{name}"] = total / cfg.epochs_per_step
    return metrics
