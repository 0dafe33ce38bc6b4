"""``hp-agent eval --model RUN`` plays as the run's rollouts trained (restricted decoding,
max_new_tokens), loads in the dtype it is told, and writes RUN/eval-<split>.json."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import hp_agent
from hp_agent.cli import app
from hp_agent.policies import LoadOptions

runner = CliRunner()


@pytest.fixture(scope="module")
def restricted_run(tmp_path_factory, _private_cache):
    """One HP-RLVR step on fetch, decoding restricted to admissible actions."""
    folder = tmp_path_factory.mktemp("runs")
    config = {"env": {"name": "fetch"}, "rollout": {"max_new_tokens": 8, "constrain_to_admissible": True},
              "trainer": {"steps": 1, "prompts_per_step": 2, "run_dir": str(folder), "name": "restricted",
                          "views_per_step": 0}}
    return hp_agent.train(config, progress=False).run_dir


@pytest.fixture
def loaded(monkeypatch):
    """The policies the command loads (the real ones, recorded)."""
    policies = []
    load = LoadOptions.load

    def recording(self, name):
        policies.append(load(self, name))
        return policies[-1]

    monkeypatch.setattr(LoadOptions, "load", recording)
    return policies


def test_a_run_is_evaluated_restricted_in_the_dtype_asked_and_saved_beside_it(restricted_run, loaded):
    result = runner.invoke(app, ["eval", "--model", str(restricted_run), "--limit", "9", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    saved = json.loads((restricted_run / "eval-test.json").read_text())
    assert saved["env"] == "fetch" and saved["tasks"] == 9
    assert saved["invalid_fraction"] == 0.0  # restricted, as the run trained: the untrained model never writes "go to X"
    [policy] = loaded
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}


def test_a_flag_overrides_the_run_s_own_setting(restricted_run, loaded, tmp_path):
    """The control: free decoding, asked for, plays mostly invalid actions, so the test above can fail."""
    out = tmp_path / "free.json"
    result = runner.invoke(app, ["eval", "--model", str(restricted_run), "--limit", "9", "--no-constrain-to-admissible",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["invalid_fraction"] > 0.5
    [policy] = loaded
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}  # auto on a CPU
