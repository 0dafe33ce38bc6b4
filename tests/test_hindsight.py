"""Hindsight: the privileged block, and scoring with the frozen snapshot."""

from dataclasses import replace

import pytest
import torch

import hp_agent.hindsight as hindsight
from hp_agent.envs import make
from hp_agent.hindsight import (
    BLOCK_HEADER,
    ScoringOptions,
    hindsight_messages,
    hindsight_sequences,
    privileged_block,
    realized_future,
    score_trajectories,
)
from hp_agent.packing import pack_sequences
from hp_agent.policies import SamplingParams
from hp_agent.trajectory import Segment, Trajectory, Turn, segments

RESPONSE = "First I add the numbers.\n\nThen I check the sum.\n\nSo the answer is \\boxed{7919}"


def _math_trajectory(policy, response=RESPONSE):
    """A single-step math trajectory whose action is ``response``, verified for real."""
    env = make("math", split="test")
    task_id = next(t for t in env.task_ids() if env.reference_answer(t) not in response and len(env.reference_answer(t)) >= 2)
    observation, info = env.reset(options={"task_id": task_id})
    messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": observation}]
    action_ids = policy.tokenizer.encode(response, add_special_tokens=False) + [policy.eos_token_id]
    _, reward, _, _, step_info = env.step(response)
    verdict = step_info["verdict"]
    turn = Turn(messages, policy.render(messages), action_ids, [0.0] * len(action_ids), response, step_info["action"])
    trajectory = Trajectory("math", task_id, info["task_type"], [turn], reward, verdict.feedback, verdict.success)
    return trajectory, env.reference_answer(task_id)


def _multi_turn_trajectory(policy, turns=4):
    made = []
    for t in range(turns):
        messages = [{"role": "user", "content": f"You are in room {t}. What now?"}]
        action_text = f"go to door {t}"
        action_ids = policy.tokenizer.encode(action_text, add_special_tokens=False) + [policy.eos_token_id]
        made.append(Turn(messages, policy.render(messages), action_ids, [0.0] * len(action_ids), action_text, action_text, f"You see door {t + 1}."))
    made[-1].observation = ""
    return Trajectory("rooms", "g1", "walk", made, reward=0.0, feedback="failure: the goal was not reached", success=False,
                      multi_turn=True)


def test_block_holds_future_and_feedback_never_the_reference(tiny_policy):
    trajectory, reference = _math_trajectory(tiny_policy)
    assert not trajectory.success and "7919" in trajectory.feedback
    token_texts = [tiny_policy.decode_tokens(trajectory.turns[0].action_ids)]
    segs = segments(trajectory, token_texts, max_segment_tokens=64)
    assert len(segs) == 3
    block = privileged_block(trajectory, segs[0], tiny_policy.tokenizer, 8, 384, tiny_policy.decode)
    assert block.startswith(BLOCK_HEADER)
    assert "Then I check the sum." in block  # the realized future of segment 0
    assert "First I add" not in block  # the segment itself is not in its own future
    assert "incorrect: final answer 7919" in block and "failure" in block
    assert reference not in block
    last = privileged_block(trajectory, segs[-1], tiny_policy.tokenizer, 8, 384, tiny_policy.decode)
    assert "end of the response" in last and reference not in last


def test_multi_turn_future_window_and_budget(tiny_policy):
    trajectory = _multi_turn_trajectory(tiny_policy, turns=6)
    future = realized_future(trajectory, Segment(0, 0, 1), future_turns=2, decode=tiny_policy.decode)
    assert "Observation 1: You see door 1." in future
    assert "Action 2: go to door 1" in future and "Action 3: go to door 2" in future
    assert "Action 4" not in future  # outside the window
    block = privileged_block(trajectory, Segment(0, 0, 1), tiny_policy.tokenizer, 8, 96, tiny_policy.decode)
    assert len(tiny_policy.tokenizer.encode(block)) <= 96
    assert "Observation 1" in block
    assert "failure: the goal was not reached" in block  # feedback survives truncation
    assert "last step" in realized_future(trajectory, Segment(5, 0, 1), 2, tiny_policy.decode)


def test_hindsight_messages_append_to_last_user_message():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    out = hindsight_messages(messages, "BLOCK")
    assert out[3]["content"] == "u2\n\nBLOCK" and out[1]["content"] == "u1"
    assert messages[3]["content"] == "u2"  # the trajectory's own messages are untouched
    with pytest.raises(ValueError, match="user message"):
        hindsight_messages([{"role": "system", "content": "s"}], "B")


def test_causal_logprobs_match_a_plain_forward(tiny_policy):
    trajectory, _ = _math_trajectory(tiny_policy)
    turn = trajectory.turns[0]
    (scores,) = score_trajectories(tiny_policy, [trajectory], ScoringOptions.from_config(), with_hindsight=False)
    ids = torch.tensor([turn.prompt_ids + turn.action_ids])
    with torch.no_grad():
        logits = tiny_policy.model(ids).logits[0]
    start = len(turn.prompt_ids)
    expected = torch.log_softmax(logits[start - 1 : -1], -1).gather(-1, ids[0, start:, None]).squeeze(-1)
    assert scores.weights is None
    assert torch.allclose(scores.causal_logprobs[0], expected, atol=1e-4)


def test_identical_contexts_give_zero_weight(tiny_policy, monkeypatch):
    """With the block removed, the two views coincide: any misalignment would show."""
    trajectory, _ = _math_trajectory(tiny_policy)
    monkeypatch.setattr(hindsight, "hindsight_messages", lambda messages, block: messages)
    (scores,) = score_trajectories(tiny_policy, [trajectory], replace(ScoringOptions.from_config(), max_segment_tokens=5), with_hindsight=True)
    assert scores.weights[0].shape == (len(trajectory.turns[0].action_ids),)
    assert scores.weights[0].abs().max().item() < 1e-5
    assert torch.allclose(scores.hindsight_logprobs[0], scores.causal_logprobs[0], atol=1e-5)


def test_hindsight_logprobs_match_a_plain_forward_of_each_hindsight_sequence(tiny_policy):
    """The sampled token's log-prob under the hindsight context (what OPSD and HCAPO read),
    segment by segment, against the model run on that segment's hindsight ids alone; and it
    differs from the causal one where the block changes the distribution."""
    long_response = "\n\n".join(f"Step {k}: add {k} and {k + 1} to get {2 * k + 1}." for k in range(3))
    trajectory, _ = _math_trajectory(tiny_policy, long_response)
    options = replace(ScoringOptions.from_config(), max_segment_tokens=12)
    (scores,) = score_trajectories(tiny_policy, [trajectory], options, with_hindsight=True)
    sequences = hindsight_sequences(tiny_policy, [trajectory], options)
    assert len(sequences) >= 3
    for _, segment, ids in sequences:
        with torch.no_grad():
            logits = tiny_policy.model(torch.tensor([ids])).logits[0]
        start = len(ids) - (segment.end - segment.start)
        expected = torch.log_softmax(logits[start - 1 : -1], -1).gather(-1, torch.tensor(ids[start:])[:, None]).squeeze(-1)
        assert torch.allclose(scores.hindsight_logprobs[segment.turn][segment.start : segment.end], expected, atol=1e-4)
    assert (scores.hindsight_logprobs[0] - scores.causal_logprobs[0]).abs().max() > 1e-3


def test_the_kept_teacher_is_the_hindsight_distribution_of_each_token(tiny_policy):
    """learner.distill=topk|full: the scorer keeps, per action token, the hindsight
    distribution's likeliest ids and their log-probs (or every log-prob), from the passes it
    already runs: equal to the model run on each segment's hindsight ids alone."""
    long_response = "\n\n".join(f"Step {k}: add {k} and {k + 1} to get {2 * k + 1}." for k in range(3))
    trajectory, _ = _math_trajectory(tiny_policy, long_response)
    base = replace(ScoringOptions.from_config(), max_segment_tokens=12)
    (top,) = score_trajectories(tiny_policy, [trajectory], replace(base, teacher="topk", teacher_topk=5), with_hindsight=True)
    (full,) = score_trajectories(tiny_policy, [trajectory], replace(base, teacher="full"), with_hindsight=True)
    (plain,) = score_trajectories(tiny_policy, [trajectory], base, with_hindsight=True)
    assert plain.teacher is None and top.teacher[0].ids.shape == (len(trajectory.turns[0].action_ids), 5)
    for _, segment, ids in hindsight_sequences(tiny_policy, [trajectory], base):
        with torch.no_grad():
            logits = tiny_policy.model(torch.tensor([ids])).logits[0]
        start = len(ids) - (segment.end - segment.start)
        expected = torch.log_softmax(logits[start - 1 : -1], -1)
        kept = top.teacher[segment.turn].rows(segment.start, segment.end)
        assert torch.allclose(kept.logprobs, expected.topk(5, -1).values, atol=1e-4)
        assert torch.equal(kept.ids, expected.topk(5, -1).indices)
        assert full.teacher[segment.turn].ids is None
        assert torch.allclose(full.teacher[segment.turn].logprobs[segment.start : segment.end], expected, atol=1e-4)
    # Keeping the teacher changes nothing else the scorer returns.
    assert all(torch.equal(a, b) for a, b in zip(top.weights, plain.weights))


def test_hindsight_weights_are_bounded_and_informative(tiny_policy):
    single, _ = _math_trajectory(tiny_policy)
    multi = _multi_turn_trajectory(tiny_policy)
    scores = score_trajectories(tiny_policy, [single, multi], replace(ScoringOptions.from_config(), score_batch_tokens=256), with_hindsight=True)
    for score, trajectory in zip(scores, [single, multi]):
        for weights, logprobs, turn in zip(score.weights, score.causal_logprobs, trajectory.turns):
            assert weights.shape == logprobs.shape == (len(turn.action_ids),)
            assert bool(((weights >= 0) & (weights <= 1)).all())
            assert bool((logprobs <= 0).all())
        assert torch.cat(score.weights).max() > 0  # the privileged block changes the distribution
    # Causal log-probs do not depend on whether hindsight was scored, nor on batching.
    plain = score_trajectories(tiny_policy, [single, multi], ScoringOptions.from_config(), with_hindsight=False)
    for a, b in zip(scores, plain):
        for x, y in zip(a.causal_logprobs, b.causal_logprobs):
            assert torch.allclose(x, y, atol=1e-4)


def _alfworld_like_trajectory(policy, turns=5):
    """Multi-turn, verl-agent style: each prompt repeats the task, recent history, the
    observation and a long list of admissible actions (hundreds of tokens)."""
    places = [f"{name} {i}" for name in ("cabinet", "drawer", "countertop", "shelf", "fridge") for i in range(1, 8)]
    made, history = [], []
    for t in range(turns):
        observation = f"You arrive at {places[t]}. On the {places[t]}, you see a mug {t + 1} and a plate {t + 2}."
        recent = " ".join(f"[Observation {k + 1}: '{o}', Action {k + 1}: '{a}']" for k, (o, a) in enumerate(history[-2:]))
        text = (f"You are an expert agent. Your task is to: put a clean mug in coffeemachine.\n"
                f"Prior to this step, you have already taken {t} step(s). {recent}\n"
                f"You are now at step {t + 1} and your current observation is: {observation}\n"
                f"Your admissible actions of the current situation are: [{', '.join(f'go to {p}' for p in places)}].")
        messages = [{"role": "system", "content": "You play household games."}, {"role": "user", "content": text}]
        action_text = f"<think>The mug may be in {places[t + 1]}.</think>\n<action>go to {places[t + 1]}</action>"
        action_ids = policy.tokenizer.encode(action_text, add_special_tokens=False) + [policy.eos_token_id]
        made.append(Turn(messages, policy.render(messages), action_ids, [0.0] * len(action_ids), action_text,
                         f"go to {places[t + 1]}", f"You arrive at {places[t + 1]}. Nothing happens."))
        history.append((observation, action_text))
    made[-1].observation = ""
    return Trajectory("alfworld", "g7", "clean", made, reward=0.0, feedback="failure: not completed within 5 steps", success=False,
                      multi_turn=True)


def _max_difference(a, b, field):
    return max((x - y).abs().max().item() for sa, sb in zip(a, b) for x, y in zip(getattr(sa, field), getattr(sb, field)))


def _long_prompt_single_step(policy):
    """A single-step task with a long statement: its segments' hindsight views share it."""
    statement = " ".join(f"Rule {k}: the box {k} holds {k * 3} red and {k + 4} blue balls." for k in range(30))
    messages = [{"role": "user", "content": f"{statement}\nHow many balls are there in all?"}]
    response = "\n\n".join(f"Box {k} holds {4 * k + 4} balls." for k in range(6)) + "\n\nSo \\boxed{999}."
    action_ids = policy.tokenizer.encode(response, add_special_tokens=False) + [policy.eos_token_id]
    turn = Turn(messages, policy.render(messages), action_ids, [0.0] * len(action_ids), response, response)
    return Trajectory("math", "boxes", "count", [turn], 0.0, "incorrect: final answer 999", False)


@pytest.mark.parametrize("kind", ["multi_turn", "single_step"])
def test_packed_scoring_equals_the_per_segment_reference(tiny_policy, kind):
    if kind == "multi_turn":
        trajectories = [_alfworld_like_trajectory(tiny_policy), _multi_turn_trajectory(tiny_policy)]
        assert min(len(turn.prompt_ids) for turn in trajectories[0].turns) > 300
    else:
        long_response = "\n\n".join(f"Step {k}: add {k} and {k + 1} to get {2 * k + 1}." for k in range(5))
        trajectories = [_math_trajectory(tiny_policy, long_response)[0], _long_prompt_single_step(tiny_policy)]
        assert len(trajectories[1].turns[0].prompt_ids) > 300
    options = replace(ScoringOptions.from_config(), max_segment_tokens=12, max_block_tokens=128)
    packed = score_trajectories(tiny_policy, trajectories, replace(options, packed=True), with_hindsight=True)
    reference = score_trajectories(tiny_policy, trajectories, replace(options, packed=False), with_hindsight=True)
    assert _max_difference(packed, reference, "causal_logprobs") <= 1e-4
    assert _max_difference(packed, reference, "weights") <= 1e-4
    assert _max_difference(packed, reference, "hindsight_logprobs") <= 1e-4
    assert max(w.max().item() for score in reference for w in score.weights) > 1e-3  # not trivially zero
    # Several segments per trajectory, and the packed rows share the long prompts' prefixes.
    hindsight = hindsight_sequences(tiny_policy, trajectories, options)
    assert all(sum(i == k for i, _, _ in hindsight) >= 4 for k in range(len(trajectories)))
    long_prompted = 0 if kind == "multi_turn" else 1
    sequences = [turn.prompt_ids + turn.action_ids for turn in trajectories[long_prompted].turns]
    sequences += [seq for i, _, seq in hindsight if i == long_prompted]
    rows, _ = pack_sequences(sequences, options.score_batch_tokens)
    assert sum(len(row) for row in rows) < 0.8 * sum(len(s) for s in sequences)
    # Without hindsight (GRPO's replay) the packed causal log-probs agree too.
    plain = score_trajectories(tiny_policy, trajectories, options, with_hindsight=False)
    assert _max_difference(plain, reference, "causal_logprobs") <= 1e-4


def test_scoring_after_a_rollout_reuses_its_prompts_keys_and_values(tiny_policy, monkeypatch):
    """As in training: the prompts were just sampled from, so the prefix cache holds
    them; packed scoring runs only what follows them and still equals the reference."""
    import hp_agent.packing as packing

    trajectories = [_alfworld_like_trajectory(tiny_policy), _multi_turn_trajectory(tiny_policy)]
    options = replace(ScoringOptions.from_config(), max_segment_tokens=12, max_block_tokens=128)
    reference = score_trajectories(tiny_policy, trajectories, replace(options, packed=False), with_hindsight=True)
    tiny_policy.prefix_cache.clear()
    prompts = [turn.prompt_ids for traj in trajectories for turn in traj.turns]
    tiny_policy.generate(prompts, SamplingParams(max_new_tokens=2, greedy=True))
    reused_widths = []
    original_batch_past = packing.batch_past
    monkeypatch.setattr(packing, "batch_past", lambda hits, **kw: reused_widths.append(max(n for _, n in hits)) or original_batch_past(hits, **kw))
    for with_hindsight in (True, False):
        packed = score_trajectories(tiny_policy, trajectories, options, with_hindsight=with_hindsight)
        assert _max_difference(packed, reference, "causal_logprobs") <= 1e-4
        if with_hindsight:
            assert _max_difference(packed, reference, "weights") <= 1e-4
    assert max(reused_widths) > 300  # the long ALFWorld prompts came from the cache
