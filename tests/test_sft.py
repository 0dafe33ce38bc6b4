"""The supervised warm-up: an interrupted run continues to the same weights, bad resumes are refused."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import hp_agent.sft as sft_module
from hp_agent.config import load_config
from hp_agent.hindsight import ScoringOptions
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.sft import sft

STEPS, SAVE_EVERY = 6, 2


def _weights(folder) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def test_interrupted_warmup_resumes_to_the_same_weights(tmp_path, monkeypatch, _private_cache):
    settings = dict(env="keys", model="tiny", steps=STEPS, batch_size=4, lr=1e-3, seed=3, save_every=SAVE_EVERY)
    whole = sft(tmp_path / "whole", **settings)

    real = sft_module.supervised_warmup
    saves = []

    def interrupted(*args, **kwargs):
        save = args[8] if len(args) > 8 else kwargs["save"]

        def save_then_stop(state):
            save(state)
            saves.append(state.step)
            if state.step == 2 * SAVE_EVERY:
                raise KeyboardInterrupt  # as a session's end would, after the second save

        return real(*args[:8], save_then_stop, *args[9:])

    monkeypatch.setattr(sft_module, "supervised_warmup", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sft(tmp_path / "resumed", **settings)
    assert saves == [SAVE_EVERY, 2 * SAVE_EVERY]
    assert (tmp_path / "resumed.partial" / "state.pt").is_file() and not (tmp_path / "resumed").exists()

    monkeypatch.setattr(sft_module, "supervised_warmup", real)
    with pytest.raises(ValueError, match="other settings \\(lr\\)"):
        sft(tmp_path / "resumed", **{**settings, "lr": 2e-3})
    resumed = sft(tmp_path / "resumed", **settings)
    assert resumed.steps == whole.steps and resumed.last_loss == pytest.approx(whole.last_loss, rel=1e-5)
    assert not (tmp_path / "resumed.partial").exists()
    whole_weights, resumed_weights = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    for name, tensor in whole_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    # and the resumed run did learn: its weights moved from the start
    start = _weights(load_policy("tiny").model.name_or_path)
    assert any(not torch.equal(start[name], tensor) for name, tensor in resumed_weights.items())


def test_hindsight_copies_of_played_episodes_show_each_turn_its_future_and_outcome(tiny_policy):
    played = sft_module.play_first_tasks(tiny_policy, "keys", {"split": "train"}, 3, SamplingParams(max_new_tokens=5))
    copies = sft_module.hindsight_copies(tiny_policy, played, ScoringOptions.from_config())
    turns = [(trajectory, turn) for trajectory in played for turn in trajectory.turns]
    assert len(played) == 3 and len(copies) == len(turns)  # keys' turns are short: one segment each
    for (trajectory, turn), (ids, [(start, end)]) in zip(turns, copies):
        assert ids[start:end] == turn.action_ids and end == len(ids)  # the target is the action that was taken
        prompt = tiny_policy.tokenizer.decode(ids[:start])
        assert f"Outcome: {'success' if trajectory.success else 'failure'}" in prompt and trajectory.feedback in prompt


@pytest.mark.slow
def test_restricted_play_in_two_processes_plays_what_one_process_plays(tiny_policy):
    """DAgger's play (``data alfworld --dagger --constrain-to-admissible --workers 2``):
    restricted, every reply is an admissible action; greedy, two workers play the games
    one process plays."""
    greedy = SamplingParams(max_new_tokens=5, greedy=True)
    kwargs = {"split": "train"}
    both = sft_module.play_first_tasks("tiny", "keys", kwargs, 5, greedy, constrain=True, workers=2)
    alone = sft_module.play_first_tasks(tiny_policy, "keys", kwargs, 5, greedy, constrain=True)
    assert [[turn.action_ids for turn in t.turns] for t in both] == [[turn.action_ids for turn in t.turns] for t in alone]
    assert len(both) == 5 and not any(turn.invalid for t in both for turn in t.turns)
    free = sft_module.play_first_tasks(tiny_policy, "keys", kwargs, 5, greedy)
    assert any(turn.invalid for t in free for turn in t.turns)  # the untrained model, unrestricted, is mostly invalid
    with pytest.raises(ValueError, match="name or folder"):
        sft_module.play_first_tasks(tiny_policy, "keys", kwargs, 5, greedy, workers=2)


def test_hindsight_warmup_from_an_env_learns_demonstrations_and_copies(tmp_path):
    plain = sft(tmp_path / "plain", env="keys", steps=1, batch_size=2)
    both = sft(tmp_path / "both", env="keys", steps=1, batch_size=2, hindsight=True, hindsight_episodes=2,
               hindsight_max_new_tokens=5)
    assert both.examples > plain.examples + 2  # the demonstrations, then a copy of every played turn
    with pytest.raises(ValueError, match="hindsight_episodes must be >= 1"):
        sft(tmp_path / "none", env="keys", steps=1, hindsight=True, hindsight_episodes=0)


def test_hindsight_copies_render_blocks_with_the_runs_hindsight_section(tmp_path, monkeypatch):
    """sft's privileged blocks are the ones the run's scorer will show: its config's, else the defaults."""
    seen = []
    copies = sft_module.hindsight_copies
    monkeypatch.setattr(sft_module, "hindsight_copies", lambda *args: seen.append(args[2]) or copies(*args))
    config = load_config(overrides=["hindsight.future_turns=1", "hindsight.max_block_tokens=96"])
    for out, run in (("default", None), ("configured", config)):
        sft(tmp_path / out, env="keys", steps=1, batch_size=2, hindsight=True, hindsight_episodes=1,
            hindsight_max_new_tokens=5, config=run)
    assert seen == [ScoringOptions.from_config(), ScoringOptions.from_config(config)]
    assert (seen[1].future_turns, seen[1].max_block_tokens) == (1, 96)


def test_prompt_loss_adds_the_prompt_tokens_nll_with_its_weight(tiny_policy):
    ids = tiny_policy.tokenizer.encode("You arrive at desk 1. <action>take pen 1 from desk 1</action>")
    start = 8
    with torch.no_grad():
        logprobs = torch.log_softmax(tiny_policy.model(torch.tensor([ids])).logits[0, :-1].float(), -1)
        chosen = logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        response_nll, prompt_nll = -chosen[start - 1 :].mean(), -chosen[: start - 1].mean()
        batch = [(ids, [(start, len(ids))])]
        pad = tiny_policy.tokenizer.pad_token_id

        def loss(weight):
            return sft_module._batch_loss(tiny_policy, batch, pad, weight, sft_module._token_counts(batch, weight))

        torch.testing.assert_close(loss(0.0), response_nll, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(loss(0.5), response_nll + 0.5 * prompt_nll, rtol=1e-4, atol=1e-4)


def test_micro_batches_share_the_batch_mean(tiny_policy):
    """Each micro-batch's loss is its share of the whole batch's mean (the batch's token
    counts as denominators): the parts sum to the one-pass loss, for both weights. A part
    normalized by its own tokens would not."""
    texts = ["You arrive at desk 1. <action>take pen 1 from desk 1</action>", "Nothing happens. <action>look</action>",
             "You open the drawer 1. It is empty. <action>close drawer 1</action>"]
    batch = []
    for text in texts:
        ids = tiny_policy.tokenizer.encode(text)
        batch.append((ids, [(len(ids) - 6, len(ids))]))
    pad = tiny_policy.tokenizer.pad_token_id
    with torch.no_grad():
        for weight in (0.0, 0.5):
            counts = sft_module._token_counts(batch, weight)
            whole = sft_module._batch_loss(tiny_policy, batch, pad, weight, counts)
            parts = sum(sft_module._batch_loss(tiny_policy, [example], pad, weight, counts) for example in batch)
            torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-5)
            alone = sft_module._batch_loss(tiny_policy, batch[:1], pad, weight, sft_module._token_counts(batch[:1], weight))
            assert not torch.isclose(alone, sft_module._batch_loss(tiny_policy, batch[:1], pad, weight, counts))
