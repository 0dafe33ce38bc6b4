"""`hp-agent data alfworld`: counts of the official games, expert demonstrations, SFT from them."""

import pytest

pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")

from typer.testing import CliRunner  # noqa: E402

from hp_agent.cli import app  # noqa: E402
from hp_agent.envs.alfworld import data  # noqa: E402
from hp_agent.envs.alfworld.catalog import describe  # noqa: E402
from hp_agent.scripted_play import expert_demonstrations  # noqa: E402
from hp_agent.sft import tokenize_demonstration, trajectory_sequences  # noqa: E402
from hp_agent.trajectory import read_jsonl, write_jsonl  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(data.find_data_root() is None, reason="official ALFWorld games not found (ALFWORLD_DATA or the shared tarball)"),
]


def test_counts_per_split_and_task_type():
    counts = describe(data.find_data_root())
    assert sum(counts["id"].values()) == 140 and sum(counts["ood"].values()) == 134
    assert set(counts["id"]) == {"pick", "look", "clean", "heat", "cool", "pick2"}
    result = CliRunner().invoke(app, ["data", "alfworld"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "140" in result.output and "134" in result.output


def test_expert_demonstrations_are_token_in_token_out(tmp_path, tiny_policy):
    out = tmp_path / "demos.jsonl"
    won, played = expert_demonstrations(split="id", limit=2)
    assert played == 2 and len(won) >= 1
    assert all(not turn.prompt_ids and not turn.action_ids for t in won for turn in t.turns)  # text only: no model
    write_jsonl(out, [tokenize_demonstration(t, tiny_policy) for t in won])
    trajectories = list(read_jsonl(out))
    assert len(trajectories) == len(won) and all(t.success for t in trajectories)
    for turn in trajectories[0].turns:
        assert turn.prompt_ids == tiny_policy.render(turn.prompt_messages)
        assert turn.action_text.startswith("<action>") and turn.action_ids[-1] == tiny_policy.tokenizer.eos_token_id
    sequences = trajectory_sequences(out, vocab_size=tiny_policy.model.config.vocab_size)
    assert len(sequences) == sum(len(t.turns) for t in trajectories)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        trajectory_sequences(out, vocab_size=10)


def test_dagger_turns_carry_the_experts_advice_for_the_state_they_were_in(tmp_path, tiny_policy):
    from hp_agent.envs.alfworld.env import AlfworldEnv
    from hp_agent.policies import SamplingParams
    from hp_agent.sft import expert_label_sequences, play_first_tasks
    from hp_agent.trajectory import write_jsonl

    kwargs = {"split": "id", "num_games": 2, "max_steps": 4}
    played = play_first_tasks(tiny_policy, "alfworld", kwargs, 2, SamplingParams(max_new_tokens=8), parallel_envs=2)
    assert len(played) == 2 and all(len(t.turns) == 4 for t in played)
    # replay each episode's actions: the advice recorded in turn k is the expert's advice
    # in the state that turn's prompt showed (before its action)
    env = AlfworldEnv(**kwargs)
    for k, trajectory in enumerate(played):  # episode k was played with seed k
        _, info = env.reset(seed=k, options={"task_id": trajectory.task_id})
        for turn in trajectory.turns:
            assert turn.expert_action == info["expert_action"] and turn.expert_action
            _, _, _, _, info = env.step(turn.action_text)
    env.close()
    out = tmp_path / "dagger.jsonl"
    write_jsonl(out, played + played)  # a repeated state is learnt once
    sequences = expert_label_sequences(tiny_policy, out)
    assert len(sequences) == len({(tuple(turn.prompt_ids), turn.expert_action) for t in played for turn in t.turns})
    labels = {tiny_policy.decode(ids[spans[0][0]:]) for ids, spans in sequences}
    assert labels == {f"<action>{turn.expert_action}</action>" for t in played for turn in t.turns}
    played[0].turns[0].prompt_ids[0] = tiny_policy.model.config.vocab_size  # as if tokenized for another model
    write_jsonl(out, played)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        expert_label_sequences(tiny_policy, out)
    with pytest.raises(ValueError, match="no turn records the expert's advice"):
        demos = tmp_path / "no-advice.jsonl"
        write_jsonl(demos, [])
        expert_label_sequences(tiny_policy, demos)


def test_chat_mode_demonstrations_are_prompted_as_a_chat_mode_run(tiny_policy):
    """With prompt_mode=chat each turn's prompt is the whole conversation so far, as the RL
    rollout of a chat-mode run (prompt_mode=chat, rollout.chat_history) prompts that state."""
    from hp_agent.envs import make
    from hp_agent.policies import SamplingParams
    from hp_agent.rollout import Episode, collect

    (won,), played = expert_demonstrations(split="id", limit=1, prompt_mode="chat")
    env = make("alfworld", split="id", num_games=1, prompt_mode="chat")
    observation, _ = env.reset(seed=0, options={"task_id": won.task_id})  # the demonstration's episode 0, seed 0
    conversation = [{"role": "user", "content": observation}]
    for turn in won.turns:
        assert turn.prompt_messages == conversation
        observation, *_ = env.step(turn.action_text)
        conversation = conversation + [{"role": "assistant", "content": turn.action_text},
                                       {"role": "user", "content": observation}]
    assert len(won.turns) > 1
    (model,) = collect(tiny_policy, [env], "alfworld", [Episode(won.task_id)], SamplingParams(max_new_tokens=4),
                       max_turns=1, chat_history=True)
    env.close()
    assert model.turns[0].prompt_ids == tokenize_demonstration(won, tiny_policy).turns[0].prompt_ids
