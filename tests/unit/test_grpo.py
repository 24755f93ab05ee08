"""GRPO trainer: advantages, batching, logprobs, the clipped loss, and updates on a tiny random Llama."""

from __future__ import annotations

import copy
import math

import pyarrow as pa
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from unit_factories import make_experience

from pipelines.reference.grpo import (
    GRPOConfig,
    advantages_for,
    kl_estimate,
    make_batch,
    make_optimizer,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
    train_on_experiences,
    zero_advantage_groups,
)
from schemas.experience import MalformedExperience, experiences_to_table

PAD = 0
GOOD, BAD, END = 5, 6, 7  # response tokens: GOOD is rewarded, BAD is not, END closes every response
PROMPTS = {"task-a": [1, 2, 3], "task-b": [4, 3]}


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(config).eval()


def experience_table(model: LlamaForCausalLM, rewards: dict[int, float]) -> pa.Table:
    """Per task: two GOOD and two BAD responses (BAD ones one token longer), logprobs from `model` itself."""
    specs = []
    for task, prompt in PROMPTS.items():
        for run, response in enumerate([[GOOD, END], [BAD, BAD, END], [GOOD, END], [BAD, BAD, END]]):
            specs.append((task, run, prompt, response))
    input_ids, attention_mask, response_mask = make_batch([s[2] for s in specs], [s[3] for s in specs], PAD)
    with torch.no_grad():
        lps = token_logprobs(model, input_ids, attention_mask)
    experiences = [
        make_experience(
            task,
            run,
            prompt_ids=prompt,
            response_ids=response,
            logprobs=lps[row][response_mask[row].bool()].tolist(),
            reward=rewards[response[0]],
        )
        for row, (task, run, prompt, response) in enumerate(specs)
    ]
    return experiences_to_table(experiences)


def mean_response_logprob(model: LlamaForCausalLM, first_token: int) -> float:
    """Mean over tasks of the summed logprob of the response that starts with `first_token`."""
    response = [GOOD, END] if first_token == GOOD else [BAD, BAD, END]
    prompts = list(PROMPTS.values())
    input_ids, attention_mask, response_mask = make_batch(prompts, [response] * len(prompts), PAD)
    with torch.no_grad():
        lps = token_logprobs(model, input_ids, attention_mask)
    return ((lps * response_mask).sum(dim=1)).mean().item()


def test_advantages_standardise_within_each_task() -> None:
    uids = ["a", "b", "a", "c", "a", "b", "d", "d", "a"]
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.0]
    runs = [0, 0, 1, 0, 2, 1, 0, 1, 3]
    table = experiences_to_table(
        [make_experience(u, r, reward=w) for u, r, w in zip(uids, runs, rewards, strict=True)]
    )
    adv = advantages_for(table)
    a = 0.5 / math.sqrt(1 / 3)  # group a = [1, 0, 1, 0]: mean 0.5, sample std sqrt(1/3)
    b = 0.5 / math.sqrt(0.5)  # group b = [0, 1]: mean 0.5, sample std sqrt(1/2)
    expected = [a, -b, -a, 0.0, a, b, 0.0, 0.0, -a]  # c is a singleton, d has equal rewards
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert zero_advantage_groups(table, adv) == (2, 4)


def test_the_explorers_advantage_is_used_where_it_was_written() -> None:
    written = [make_experience("a", r, reward=float(r % 2), advantage=v) for r, v in enumerate([0.5, None])]
    adv = advantages_for(experiences_to_table(written))
    # run 0 keeps the explorer's 0.5; run 1 has none, so gets GRPO's: [0, 1] -> +0.707 for it
    assert adv.tolist() == pytest.approx([0.5, 0.5 / math.sqrt(0.5)], abs=1e-5)


def test_make_batch_right_pads_and_marks_response_targets() -> None:
    input_ids, attention_mask, response_mask = make_batch([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=9)
    assert input_ids.dtype == torch.long
    assert input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 9, 9, 9]]
    assert attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert response_mask.dtype == torch.float32
    assert response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]


def test_make_batch_refuses_an_empty_prompt() -> None:
    with pytest.raises(ValueError):
        make_batch([[]], [[4]], pad_id=0)


def test_token_logprobs_match_a_manual_gather_and_ignore_right_padding() -> None:
    model = tiny_model()
    input_ids, attention_mask, _ = make_batch([[1, 2, 3], [4]], [[5, 6], [7]], PAD)
    with torch.no_grad():
        got = token_logprobs(model, input_ids, attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        alone = token_logprobs(model, input_ids[1:, :2], attention_mask[1:, :2])
    log_probs = torch.log_softmax(logits, dim=-1)
    assert got.shape == input_ids.shape
    for b in range(2):
        assert got[b, 0].item() == 0.0
        for t in range(1, input_ids.shape[1]):
            assert got[b, t].item() == pytest.approx(log_probs[b, t - 1, input_ids[b, t]].item(), abs=1e-5)
    torch.testing.assert_close(got[1, :2], alone[0])


def test_entropy_is_that_of_each_positions_distribution() -> None:
    model = tiny_model()
    input_ids, attention_mask, _ = make_batch([[1, 2, 3]], [[5, 6]], PAD)
    with torch.no_grad():
        _, entropy = token_logprobs_and_entropy(model, input_ids, attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    expected = torch.distributions.Categorical(logits=logits[0, :-1]).entropy()
    assert entropy[0, 0].item() == 0.0
    torch.testing.assert_close(entropy[0, 1:], expected, rtol=1e-5, atol=1e-5)


def test_entropy_and_kl_to_start_are_measured_at_the_weights_before_each_update() -> None:
    model = tiny_model()
    start = copy.deepcopy(model)
    cfg = GRPOConfig(lr=1e-2, micro_batch=3)
    optimizer = make_optimizer(model, cfg)
    table = experience_table(model, {GOOD: 1.0, BAD: 0.0})
    first = train_on_experiences(model, optimizer, table, cfg, PAD, reference=start)
    assert first["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)  # still the starting weights
    assert 0.0 < first["train/entropy"] <= math.log(32)
    assert first["train/lr"] == 1e-2 and first["train/zero_adv_groups"] == 0.0
    second = train_on_experiences(model, optimizer, table, cfg, PAD, reference=start)
    assert second["train/kl_to_start"] > 1e-4  # one update away from the start
    assert "train/kl_to_start" not in train_on_experiences(model, optimizer, table, cfg, PAD)


def test_kl_estimate_is_zero_at_equal_logprobs_and_positive_otherwise() -> None:
    policy = torch.tensor([-1.0, -2.0, -0.5])
    assert kl_estimate(policy, policy).tolist() == [0.0, 0.0, 0.0]
    assert (kl_estimate(policy, policy + torch.tensor([0.3, -0.3, 1.0])) > 0).all()


def test_policy_loss_is_minus_mean_advantage_when_policy_is_unchanged() -> None:
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 6)
    advantages = torch.tensor([1.5, -0.5, 0.25])
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.float32)
    loss, stats = policy_loss(logprobs.clone(), logprobs, advantages, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-advantages.mean().item(), abs=1e-6)
    assert stats == {"clip_frac": 0.0, "ratio_mean": pytest.approx(1.0)}


def test_policy_loss_clips_only_where_the_ratio_runs_past_the_advantage() -> None:
    old = torch.zeros(2, 2)
    new = torch.full((2, 2), math.log(1.5), requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    loss, stats = policy_loss(new, old, advantages, mask, clip_eps=0.2)
    # positive advantage: capped at 1.2 * A; negative advantage: the unclipped 1.5 * A is the minimum
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx(1.5)
    loss.backward()
    assert new.grad[0, 1].item() == 0.0  # clipped token: no gradient
    assert new.grad[1, 1].item() == pytest.approx(1.5 / 2)  # d(-ratio * A)/d(new) / n_seqs
    assert new.grad[:, 0].tolist() == [0.0, 0.0]  # prompt positions never train


def test_training_raises_the_logprob_of_rewarded_responses() -> None:
    model = tiny_model()
    cfg = GRPOConfig(lr=1e-2, micro_batch=3)
    optimizer = make_optimizer(model, cfg)
    good_before, bad_before = mean_response_logprob(model, GOOD), mean_response_logprob(model, BAD)
    for step in range(6):
        table = experience_table(model, {GOOD: 1.0, BAD: 0.0})  # on-policy: logprobs from the current model
        metrics = train_on_experiences(model, optimizer, table, cfg, PAD)
        if step == 0:
            # stored logprobs are the model's own, so the first loss is -mean(A) = 0 and nothing is clipped
            assert metrics["train/loss"] == pytest.approx(0.0, abs=1e-5)
            assert metrics["train/clip_frac"] == 0.0
        assert metrics["train/samples"] == 8.0
        assert metrics["train/reward_mean"] == pytest.approx(0.5)
        assert metrics["train/grad_norm"] > 0.0
    assert not model.training
    assert mean_response_logprob(model, GOOD) > good_before + 0.5
    assert mean_response_logprob(model, BAD) < bad_before - 0.5


def test_update_does_not_depend_on_micro_batch_size() -> None:
    base = tiny_model()
    table = experience_table(base, {GOOD: 1.0, BAD: 0.0})
    updated = []
    for micro_batch in (1, 3, 16):
        model = copy.deepcopy(base)
        cfg = GRPOConfig(micro_batch=micro_batch, max_grad_norm=1e9)
        train_on_experiences(model, torch.optim.SGD(model.parameters(), lr=1.0), table, cfg, PAD)
        updated.append(model.state_dict())
    for other in updated[1:]:
        for name, tensor in updated[0].items():
            torch.testing.assert_close(other[name], tensor, rtol=1e-4, atol=1e-6)


def test_one_optimizer_step_per_epoch() -> None:
    model = tiny_model()
    cfg = GRPOConfig(micro_batch=3, epochs_per_step=2)
    optimizer = make_optimizer(model, cfg)
    train_on_experiences(model, optimizer, experience_table(model, {GOOD: 1.0, BAD: 0.0}), cfg, PAD)
    steps = {state["step"].item() for state in optimizer.state.values()}
    assert steps == {2}


def test_zero_advantages_leave_the_weights_unchanged() -> None:
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    cfg = GRPOConfig(lr=1e-2)
    optimizer = make_optimizer(model, cfg)
    metrics = train_on_experiences(model, optimizer, experience_table(model, {GOOD: 1.0, BAD: 1.0}), cfg, PAD)
    assert metrics == {
        "train/loss": 0.0,
        "train/clip_frac": 0.0,
        "train/grad_norm": 0.0,
        "train/samples": 0.0,
        "train/reward_mean": 1.0,
        "train/zero_adv_groups": 2.0,
        "train/groups": 2.0,
        "train/lr": 1e-2,
    }
    assert not optimizer.state
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_tokens_outside_the_action_mask_are_not_trained_on() -> None:
    model = tiny_model()
    table = experience_table(model, {GOOD: 1.0, BAD: 0.0})
    none = [[False] * len(r) for r in table.column("response_ids").to_pylist()]
    masks = pa.array(none, type=pa.list_(pa.bool_()))
    table = table.set_column(table.schema.get_field_index("action_mask"), "action_mask", masks)
    metrics = train_on_experiences(model, make_optimizer(model, GRPOConfig()), table, GRPOConfig(), PAD)
    assert metrics["train/samples"] == 8.0
    assert metrics["train/grad_norm"] == 0.0


def test_logprobs_that_do_not_line_up_with_the_response_are_refused() -> None:
    model = tiny_model()
    table = experience_table(model, {GOOD: 1.0, BAD: 0.0})
    short = pa.array([lps[:-1] for lps in table.column("logprobs").to_pylist()], type=pa.list_(pa.float32()))
    table = table.set_column(table.schema.get_field_index("logprobs"), "logprobs", short)
    with pytest.raises(MalformedExperience):
        train_on_experiences(model, make_optimizer(model, GRPOConfig()), table, GRPOConfig(), PAD)


def multi_turn_table(model: LlamaForCausalLM, inserted_logprob: float) -> pa.Table:
    """Per task, two-call trajectories from `operators.workflows.trajectory`: a sampled stretch, an inserted
    observation (masked out), a second sampled stretch; GOOD runs rewarded, BAD runs not."""
    from operators.workflows.trajectory import Call, assemble, segment_experiences
    from schemas.task import Task

    observation = [9, 9, 8]
    experiences = []
    for name, prompt in PROMPTS.items():
        task = Task(
            name, taskset="t", epoch=0, index=0, step=1, prompt="", truth="", workflow="w", reward_fn=""
        )
        for run, token in enumerate([GOOD, BAD, GOOD, BAD]):
            first = [token, END]
            second_prompt = [*prompt, *first, *observation]
            calls = [
                Call(prompt, first, [0.0] * 2, 0, "stop"),
                Call(second_prompt, [token, END], [0.0] * 2, 0, "stop"),
            ]
            [segment] = assemble(calls)
            experiences += segment_experiences(task, run, [segment], [("", "")], float(token == GOOD), {})
    for experience in experiences:  # the sampled tokens' logprobs from the model itself, as an engine gives
        ids = [*experience.prompt_ids, *experience.response_ids]
        batch, attention, response = make_batch([experience.prompt_ids], [experience.response_ids], PAD)
        with torch.no_grad():
            lps = token_logprobs(model, batch, attention)[0][response[0].bool()].tolist()
        experience.logprobs = [
            lp if m else inserted_logprob for lp, m in zip(lps, experience.action_mask, strict=True)
        ]
        assert len(ids) == len(experience.prompt_ids) + len(lps)
    return experiences_to_table(experiences)


def test_multi_turn_experiences_train_only_on_their_sampled_tokens() -> None:
    """The loop closed on multi-turn experiences: the update is the same whatever the masked positions'
    logprobs hold, and it raises the rewarded runs' sampled tokens."""
    updated = []
    for inserted_logprob in (0.0, -50.0):
        model = tiny_model()
        cfg = GRPOConfig(lr=1e-2)
        table = multi_turn_table(model, inserted_logprob)
        assert set(map(len, table.column("inserted_spans").to_pylist())) == {1}
        before = mean_response_logprob(model, GOOD)
        train_on_experiences(model, make_optimizer(model, cfg), table, cfg, PAD)
        assert mean_response_logprob(model, GOOD) > before
        updated.append(model.state_dict())
    for name, tensor in updated[0].items():
        assert torch.equal(tensor, updated[1][name]), name
