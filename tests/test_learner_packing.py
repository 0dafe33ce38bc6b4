"""learner.packed: a micro-batch's sequences run as prefix-tree rows, a GRPO group's prompt
once. It changes what the forward costs, never the loss, the gradients or the update."""

import copy
import random
from dataclasses import replace

import pytest
import torch

from hp_agent.config import TrainConfig
from hp_agent.errors import UserValueError
from hp_agent.learner import Learner, TrainingSample, clipped_policy_loss
from hp_agent.packing import pack_sequences
from hp_agent.parallel import TrainModel
from hp_agent.policies import load_policy

TEMPERATURE = 0.8


@pytest.fixture()
def policy():
    torch.manual_seed(0)
    return load_policy("tiny")


def _grpo_batch(vocab: int, prompts: int, group: int, prompt_tokens: int, action_tokens: tuple[int, int],
                seed: int = 0) -> list[TrainingSample]:
    """``prompts`` x ``group`` samples, a group's members after one prompt; actions of
    random lengths in ``action_tokens``, each opening with its own token (so a group shares
    exactly its prompt), every other member restricted to a few tokens at some positions."""
    rng = random.Random(seed)
    samples = []
    for _ in range(prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
        openings = rng.sample(range(3, vocab), group)
        for g in range(group):
            action = [openings[g]] + [rng.randrange(3, vocab) for _ in range(rng.randint(*action_tokens) - 1)]
            allowed = [sorted({token, *rng.sample(range(3, vocab), 4)}) if k % 3 == 1 else None
                       for k, token in enumerate(action)] if g % 2 else None
            credit = torch.full((len(action),), rng.uniform(-1.0, 1.0))  # GRPO: the trajectory's advantage
            samples.append(TrainingSample(prompt + action, len(prompt), None, credit, allowed))
    return samples


def _forward_inputs(samples: list[TrainingSample]):
    spans = [(s.action_start, len(s.input_ids)) for s in samples]
    allowed = [tokens for s in samples for tokens in (s.allowed or [None] * s.num_action_tokens)]
    return [s.input_ids for s in samples], spans, allowed


def _with_behaviour_logprobs(policy, samples: list[TrainingSample], noise: float = 0.3) -> list[TrainingSample]:
    """``samples`` with old log-probs near the model's own, so that some ratios clip."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        own = TrainModel(policy.model, TEMPERATURE, packed=False).forward(*_forward_inputs(samples))
    return [replace(s, old_logprobs=lp + noise * torch.randn(lp.shape, generator=generator))
            for s, lp in zip(samples, own)]


def _loss_and_grads(policy, samples: list[TrainingSample], packed: bool, mixed_precision: bool = False):
    model = TrainModel(policy.model, TEMPERATURE, packed=packed, mixed_precision=mixed_precision)
    policy.model.zero_grad(set_to_none=True)
    logprobs = torch.cat(model.forward(*_forward_inputs(samples)))
    old = torch.cat([s.old_logprobs for s in samples])
    loss, metrics = clipped_policy_loss(logprobs, old, torch.cat([s.credit for s in samples]), 0.2, 0.28, 3.0)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in policy.model.named_parameters()}
    policy.model.zero_grad(set_to_none=True)
    return loss.detach(), grads, metrics


def test_packed_loss_and_gradients_are_the_padded_ones(policy):
    """2 prompts x 4 rollouts, actions of 3-20 tokens, restricted sets on some: float32 to 1e-5."""
    samples = _with_behaviour_logprobs(policy, _grpo_batch(policy.model.config.vocab_size, 2, 4, 40, (3, 20)))
    padded_loss, padded, metrics = _loss_and_grads(policy, samples, packed=False)
    packed_loss, packed, _ = _loss_and_grads(policy, samples, packed=True)
    assert 0 < metrics["loss/clip_fraction"] < 1  # both branches of the clip are exercised
    assert torch.allclose(packed_loss, padded_loss, rtol=1e-5, atol=1e-5)
    assert any(bool(g.abs().max() > 0) for g in padded.values())
    worst = max(float((packed[name] - padded[name]).abs().max()) for name in padded)
    print(f"float32: |loss difference| {float((packed_loss - padded_loss).abs()):.2e}, largest |gradient difference| {worst:.2e}")
    for name, grad in padded.items():
        assert torch.allclose(packed[name], grad, rtol=1e-5, atol=1e-5), name


def test_under_bf16_autocast_packed_agrees_with_padded(policy):
    """The tree mask goes to sdpa as booleans, which bf16 queries (autocast, FSDP2's bf16
    weights) take as they are; the two paths then differ only by bf16 rounding."""
    samples = _with_behaviour_logprobs(policy, _grpo_batch(policy.model.config.vocab_size, 2, 4, 40, (3, 20)))
    padded_loss, padded, _ = _loss_and_grads(policy, samples, packed=False, mixed_precision=True)
    packed_loss, packed, _ = _loss_and_grads(policy, samples, packed=True, mixed_precision=True)
    exact_loss, exact, _ = _loss_and_grads(policy, samples, packed=False)
    flat = {name: torch.cat([g.flatten() for g in grads.values()]).double() for name, grads in
            (("padded", padded), ("packed", packed), ("float32", exact))}

    def cosine(a: str, b: str) -> float:
        return float(torch.nn.functional.cosine_similarity(flat[a], flat[b], dim=0))

    print(f"bf16 autocast: loss packed {float(packed_loss):.6f} padded {float(padded_loss):.6f} float32 "
          f"{float(exact_loss):.6f}; gradient cosine packed/padded {cosine('packed', 'padded'):.5f}, packed/float32 "
          f"{cosine('packed', 'float32'):.5f}, padded/float32 {cosine('padded', 'float32'):.5f}; norms packed "
          f"{float(flat['packed'].norm()):.5f} padded {float(flat['padded'].norm()):.5f}")
    assert not torch.equal(flat["padded"], flat["float32"])  # autocast did compute in bf16
    assert float(packed_loss) == pytest.approx(float(padded_loss), rel=2e-2, abs=1e-3)
    assert cosine("packed", "padded") > 0.999
    assert cosine("packed", "float32") > 0.999  # packing adds no error of its own beyond bf16's
    assert float(flat["packed"].norm()) == pytest.approx(float(flat["padded"].norm()), rel=2e-2)


@pytest.mark.parametrize(("prompt", "actions"), [(68, (10, 64)), (40, (64, 64))])  # also answers longer than the prompt
def test_a_group_runs_its_prompt_once(prompt, actions):
    """Nodes packed for a group with one shared prompt: the prompt plus every action, exactly."""
    samples = _grpo_batch(1600, 1, 8, prompt, actions)
    rows, _ = pack_sequences([s.input_ids for s in samples], max_tokens=4096, prompts=[s.action_start for s in samples])
    assert len(rows) == 1
    assert len(rows[0]) == prompt + sum(s.num_action_tokens for s in samples)
    assert sum(len(s.input_ids) for s in samples) == 8 * prompt + sum(s.num_action_tokens for s in samples)


def _tokens_run(learner: Learner, samples: list[TrainingSample]) -> int:
    """Token slots (padding included) the decoder runs in one learner step on ``samples``."""
    counted = []
    decoder = learner.model.trained.get_decoder()
    hook = decoder.register_forward_pre_hook(lambda _, args, kwargs: counted.append(kwargs["input_ids"].numel()),
                                             with_kwargs=True)
    try:
        learner.step([[s] for s in samples])
    finally:
        hook.remove()
    return sum(counted)


def _learner(policy, packed: bool, group_size: int, mini_batch_prompts: int, micro_batch_tokens: int = 4096) -> Learner:
    config = TrainConfig.model_validate({"algo": {"name": "grpo", "group_size": group_size}, "rollout": {"temperature": TEMPERATURE},
                                         "learner": {"lr": 1e-3, "max_grad_norm": 1e9, "packed": packed,
                                                     "mini_batch_prompts": mini_batch_prompts,
                                                     "micro_batch_tokens": micro_batch_tokens}})
    return Learner.from_config(policy, config)


def test_the_forward_runs_fewer_tokens_by_the_prompts_share(policy):
    """4 prompts x G=8, 64 new tokens each, 68-token prompts (the math env's average): a
    group runs 68 + 8 x 64 = 580 tokens packed instead of 8 x 132 = 1,056."""
    samples = _grpo_batch(policy.model.config.vocab_size, 4, 8, 68, (64, 64))
    unpadded = sum(len(s.input_ids) for s in samples)
    padded = _tokens_run(_learner(copy.deepcopy(policy), False, 8, 4), samples)
    packed = _tokens_run(_learner(policy, True, 8, 4), samples)
    assert unpadded == padded == 4 * 8 * (68 + 64)  # one pass per group (record), no padding at equal lengths
    assert packed == 4 * (68 + 8 * 64)  # each prompt once
    drop = 1 - packed / padded
    print(f"tokens run, 4 prompts x 8 x 64 new tokens: unpadded {unpadded}, padded {padded}, packed {packed}: {drop:.1%} fewer")
    assert 0.40 < drop < 0.50


@pytest.mark.parametrize("micro_batch_tokens", [64, 4096])
def test_a_learner_step_is_the_same_packed_or_not(policy, micro_batch_tokens):
    """Two optimizer steps (one prompt each, the second off-policy) on 2 prompts x 4 give
    the same weights to 1e-5, whatever the micro-batching (64: a row per sequence).

    With plain SGD at lr 1, so that a weight moves by its gradient (up to 0.17 here):
    AdamW's first step moves a weight by lr * g / (|g| + eps), which turns float rounding
    in near-zero gradients into visible steps (measured: gradients equal to 7e-8 gave
    weights up to 1.1e-4 apart at lr 1e-3, in at most 5 of the 2.8M weights)."""
    samples = _with_behaviour_logprobs(policy, _grpo_batch(policy.model.config.vocab_size, 2, 4, 40, (3, 20)))
    other = copy.deepcopy(policy)
    records = {}
    for packed, model in ((False, other), (True, policy)):
        learner = _learner(model, packed, 4, 1, micro_batch_tokens)
        learner.optimizer = torch.optim.SGD(learner.model.parameters, lr=1.0)
        records[packed] = learner.step([[s] for s in samples])
    assert len(records[True]) == len(records[False]) == 2
    for a, b in zip(records[True], records[False]):
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5) and a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-7)
    start = load_policy("tiny").model.state_dict()
    moved = 0
    for (name, a), b in zip(policy.model.state_dict().items(), other.model.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), name
        moved += int(not torch.equal(a, start[name]))
    assert moved > 0


def test_attention_without_4d_masks_names_the_way_out(policy):
    policy.model.config._attn_implementation = "flash_attention_2"  # would ignore a packed row's mask
    with pytest.raises(UserValueError, match="learner.packed=false"):
        _learner(policy, True, 8, 8)
    _learner(policy, False, 8, 8)  # padded rows need no custom mask


def test_the_logit_chunk_changes_no_log_prob_and_the_plan_counts_it(policy):
    """learner.logit_chunk_tokens: 3 tokens of logits at a time give the log-probs of 512 at a
    time (float32, 1e-6), restricted sets included; and the memory plan's learner peak grows
    with the chunk by exactly the chunk's backward transients (V x 8 bytes a token)."""
    from hp_agent import memory_plan
    from hp_agent.config import load_config

    samples = _grpo_batch(policy.model.config.vocab_size, 2, 4, 40, (3, 20))
    with torch.no_grad():
        whole, chunked = (torch.cat(TrainModel(policy.model, TEMPERATURE, packed=True, logit_chunk_tokens=chunk)
                                    .forward(*_forward_inputs(samples))) for chunk in (512, 3))
    assert torch.allclose(whole, chunked, atol=1e-6)
    assert Learner.from_config(policy, load_config(None, ["learner.logit_chunk_tokens=3"])).model.module.logit_chunk_tokens == 3
    shape = memory_plan.ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=1000,
                                   tied=True, max_positions=4096)
    assert memory_plan.learner_logits(shape, 4096, 1024) - memory_plan.learner_logits(shape, 4096, 512) == 512 * 1000 * 8
