"""Multi-turn training end to end: the tiny model on official ALFWorld games, both algorithms."""

import pytest

pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")

import hp_agent  # noqa: E402
from hp_agent.envs.alfworld import data  # noqa: E402
from hp_agent.files import read_jsonl_records  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(data.find_data_root() is None, reason="official ALFWorld games not found (ALFWORLD_DATA or the shared tarball)"),
]


@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_alfworld_trains_with_workers(tmp_path, algo):
    config = {
        "env": {"name": "alfworld", "kwargs": {"split": "id", "max_steps": 3, "num_games": 4}, "num_workers": 2},
        "algo": {"name": algo, **({"group_size": 2} if algo == "grpo" else {})},
        "rollout": {"max_new_tokens": 16},
        "trainer": {"steps": 1, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": algo},
    }
    summary = hp_agent.train(config, progress=False)
    (metrics,) = read_jsonl_records(summary.run_dir / "metrics.jsonl")
    assert metrics["rollout/turns_mean"] == 3.0 and metrics["rollout/errored"] == 0.0
    assert metrics["rollout/invalid_fraction"] > 0  # a random tiny model does not write <action> tags...
    assert summary.grad_records == 1
    if algo == "hp-rlvr":
        assert metrics["credit/abs_mean"] > 0  # ...so invalid-action penalties alone give credit
    trajectories = read_jsonl_records(summary.run_dir / "trajectories.jsonl")
    assert len(trajectories) == 2 * (2 if algo == "grpo" else 1)
    for trajectory in trajectories:
        assert len(trajectory["turns"]) == 3 and trajectory["truncated"]
        for turn in trajectory["turns"][:-1]:
            # the recorded observation is the new game text, not the next whole prompt
            assert turn["observation"] and "You are an expert agent" not in turn["observation"]
