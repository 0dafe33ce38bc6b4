"""The algorithm's math: JSD, HP-RLVR credit, historical baseline, GRPO advantages."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from hp_agent.credit import (
    HistoricalBaseline,
    chunked_jsd_from_logits,
    chunked_logprobs,
    grpo_advantages,
    hp_rlvr_credit,
    jsd_from_logits,
    jsd_weights_from_hidden,
    normalize_weights,
)

INF = float("inf")


def test_jsd_identical_is_zero():
    logits = torch.randn(5, 50)
    assert torch.allclose(jsd_from_logits(logits, logits), torch.zeros(5), atol=1e-6)


def test_jsd_disjoint_supports_is_one():
    p = torch.tensor([[0.0, 0.0, -INF, -INF]])
    q = torch.tensor([[-INF, -INF, 1.0, 3.0]])
    assert jsd_from_logits(p, q).item() == pytest.approx(1.0, abs=1e-6)


def test_jsd_symmetric_and_bounded():
    a, b = torch.randn(20, 30) * 3, torch.randn(20, 30) * 3
    forward, backward = jsd_from_logits(a, b), jsd_from_logits(b, a)
    assert torch.allclose(forward, backward, atol=1e-6)
    assert bool(((forward >= 0) & (forward <= 1)).all())


def test_jsd_matches_scipy_on_random_distributions():
    rng = np.random.default_rng(0)
    for _ in range(20):
        vocab = int(rng.integers(2, 300))
        p_logits = torch.tensor(rng.normal(size=vocab) * rng.uniform(0.1, 5))
        q_logits = torch.tensor(rng.normal(size=vocab) * rng.uniform(0.1, 5))
        p = torch.softmax(p_logits, -1).numpy()
        q = torch.softmax(q_logits, -1).numpy()
        expected = jensenshannon(p, q, base=2) ** 2
        got = jsd_from_logits(p_logits[None].float(), q_logits[None].float()).item()
        assert got == pytest.approx(expected, abs=1e-5)


def test_jsd_finite_with_masked_logits():
    p = torch.tensor([[1.0, -INF, 2.0, -INF], [-INF, -INF, 0.0, -INF]])
    q = torch.tensor([[1.0, 0.5, -INF, -INF], [-INF, -INF, 0.0, -INF]])
    out = jsd_from_logits(p, q)
    assert torch.isfinite(out).all()
    assert out[1].item() == pytest.approx(0.0, abs=1e-7)
    expected = jensenshannon(torch.softmax(p[0], -1).numpy(), torch.softmax(q[0], -1).numpy(), base=2) ** 2
    assert out[0].item() == pytest.approx(expected, abs=1e-5)


def test_chunked_jsd_equals_unchunked():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 40, bias=False)
    causal, hindsight = torch.randn(13, 8), torch.randn(13, 8)
    ids = torch.randint(0, 40, (13,))
    with torch.no_grad():
        whole = jsd_from_logits(head(causal), head(hindsight))
        reference_lp = torch.log_softmax(head(causal), -1).gather(-1, ids[:, None]).squeeze(-1)
        # chunk_elements 120 -> 3 rows at a time inside each 4-token chunk; 1 -> one row at a time.
        for chunk_size, chunk_elements in [(4, 1 << 23), (4, 120), (13, 1), (100, 40 * 5)]:
            weights, logprobs = jsd_weights_from_hidden(causal, hindsight, ids, head, chunk_size, chunk_elements)
            assert torch.allclose(weights, whole, atol=1e-6)
            assert torch.allclose(logprobs, reference_lp, atol=1e-6)
        assert torch.allclose(chunked_logprobs(causal, ids, head, chunk_size=5), reference_lp, atol=1e-6)
        empty = jsd_weights_from_hidden(causal[:0], hindsight[:0], ids[:0], head)
        assert empty[0].shape == empty[1].shape == (0,)


@pytest.mark.parametrize("chunk_elements", [1, 50, 1 << 23])
def test_chunked_jsd_from_logits_matches_the_formula_and_its_bounds(chunk_elements):
    torch.manual_seed(1)
    p, q = torch.randn(11, 30) * 3, torch.randn(11, 30) * 3
    p[2, :10] = q[5, 3:] = -INF  # masked vocabulary
    out = chunked_jsd_from_logits(p, q, chunk_elements)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, jsd_from_logits(p, q), atol=1e-6)
    assert torch.allclose(chunked_jsd_from_logits(p, p, chunk_elements), torch.zeros(11), atol=1e-6)
    disjoint_p = torch.tensor([[0.0, 1.0, -INF, -INF]] * 3)
    disjoint_q = torch.tensor([[-INF, -INF, 2.0, 0.0]] * 3)
    assert torch.allclose(chunked_jsd_from_logits(disjoint_p, disjoint_q, chunk_elements), torch.ones(3), atol=1e-6)
    assert chunked_jsd_from_logits(p[:0], q[:0], chunk_elements).shape == (0,)


@pytest.mark.slow
def test_compiled_kernel_matches_eager():
    torch.manual_seed(2)
    p, q = torch.randn(7, 500) * 2, torch.randn(7, 500) * 2
    p[0, 100:] = -INF
    eager = chunked_jsd_from_logits(p, q, chunk_elements=1500)
    compiled = chunked_jsd_from_logits(p, q, chunk_elements=1500, compiled=True)  # chunks of 3, 3 and 1 rows
    assert torch.isfinite(compiled).all()
    assert torch.allclose(compiled, eager, atol=1e-5)


@pytest.mark.parametrize("reward,baseline", [(1.0, 0.3), (0.0, 0.3), (10.0, 2.5), (0.0, 0.0)])
def test_credit_sign_follows_reward_minus_baseline(reward, baseline):
    weights = torch.rand(50)
    credit, _ = hp_rlvr_credit(weights, reward, baseline)
    assert torch.allclose(credit, weights * (reward - baseline))
    if reward > baseline:
        assert bool((credit >= 0).all()) and credit.sum() > 0
    elif reward < baseline:
        assert bool((credit <= 0).all()) and credit.sum() < 0
    else:
        assert bool((credit == 0).all())


def test_credit_bound_holds():
    r_min, r_max = 0.0, 10.0
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        weights = jsd_from_logits(torch.randn(30, 20, generator=gen) * 4, torch.randn(30, 20, generator=gen) * 4)
        reward = float(torch.empty(1).uniform_(r_min, r_max, generator=gen))
        baseline = float(torch.empty(1).uniform_(r_min, r_max, generator=gen))
        credit, _ = hp_rlvr_credit(weights, reward, baseline)
        assert credit.abs().max() <= abs(r_max - r_min) + 1e-6


def test_credit_adds_turn_penalties():
    credit, _ = hp_rlvr_credit(torch.tensor([0.5, 0.5, 1.0]), 10.0, 5.0, torch.tensor([0.0, 0.0, -0.1]))
    assert torch.allclose(credit, torch.tensor([2.5, 2.5, 4.9]))


def test_baseline_read_before_update_and_falls_back():
    baseline = HistoricalBaseline(rate=0.5, initial=0.5, prior_weight=0.0)
    assert baseline.value("math", "percent", "a") == 0.5  # nothing seen: initial
    b = baseline.value("math", "percent", "a")
    credit, _ = hp_rlvr_credit(torch.ones(3), 1.0, b)
    assert torch.allclose(credit, torch.full((3,), 0.5))  # the reward did not center itself
    baseline.update("math", "percent", "a", 1.0)
    assert baseline.value("math", "percent", "a") == 1.0
    assert baseline.value("math", "percent", "b") == 1.0  # unseen task: task-type estimate
    assert baseline.value("math", "geometry", "c") == 1.0  # unseen type: env estimate
    assert baseline.value("code", "x", "y") == 0.5  # other env: initial
    baseline.update("math", "percent", "a", 0.0)
    assert baseline.value("math", "percent", "a") == 0.5  # running mean of the first 1/rate
    baseline.update("math", "percent", "a", 0.0)
    assert baseline.value("math", "percent", "a") == 0.25  # then EMA with rate 0.5


def test_baseline_prior_shrinks_toward_the_coarser_estimate():
    baseline = HistoricalBaseline(rate=0.1, initial=0.5, prior_weight=1.0)
    baseline.update("math", "percent", "a", 0.0)
    assert baseline.value("math", "percent", "a") == 0.25  # (0.5 prior + 0.0) / 2
    for _ in range(200):
        baseline.update("math", "percent", "a", 0.0)
    b = baseline.value("math", "percent", "a")
    assert 0.0 < b < 1e-6  # always failing: b decays but never reaches 0 exactly
    credit, _ = hp_rlvr_credit(torch.ones(2), 0.0, b)
    assert bool((credit < 0).all())  # so failures keep a (small) negative credit
    baseline.update("math", "percent", "new", 1.0)  # a new task starts from its type's estimate
    assert baseline.value("math", "percent", "new") == pytest.approx((b + 1.0) / 2)


def test_baseline_state_round_trip():
    baseline = HistoricalBaseline(rate=0.1, initial=5.0)
    baseline.update("alfworld", "pick", "g1", 10.0)
    restored = HistoricalBaseline()
    restored.load_state_dict(baseline.state_dict())
    assert restored.value("alfworld", "pick", "g1") == baseline.value("alfworld", "pick", "g1") == 7.5
    assert restored.initial == 5.0


def test_normalize_weights():
    w = torch.tensor([0.1, 0.2, 0.4])
    assert torch.allclose(normalize_weights(w, "none"), w)
    assert torch.allclose(normalize_weights(w, "max"), torch.tensor([0.25, 0.5, 1.0]))
    assert normalize_weights(w, "mean").max() <= 1.0
    assert torch.equal(normalize_weights(torch.zeros(3), "max"), torch.zeros(3))
    with pytest.raises(ValueError, match="valid: none, max, mean"):
        normalize_weights(w, "softmax")


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    advantages, metrics = grpo_advantages(rewards, groups, eps=0.0)
    mean, std = 0.75, math.sqrt(((0.25**2) * 3 + 0.75**2) / 3)  # unbiased std
    expected = [(r - mean) / std for r in (1.0, 0.0, 1.0, 1.0)] + [0.0] * 4
    assert torch.allclose(advantages, torch.tensor(expected), atol=1e-6)
    assert metrics["credit/degenerate_group_fraction"] == 0.5
    unscaled, _ = grpo_advantages(rewards, groups, scale_by_std=False)
    assert torch.allclose(unscaled[:4], torch.tensor([0.25, -0.75, 0.25, 0.25]))


def test_grpo_equal_rewards_give_exact_zero():
    advantages, metrics = grpo_advantages(torch.full((8,), 10.0), torch.zeros(8, dtype=torch.long))
    assert torch.equal(advantages, torch.zeros(8))
    assert metrics["credit/degenerate_group_fraction"] == 1.0
