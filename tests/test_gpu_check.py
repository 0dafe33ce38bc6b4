"""scripts/gpu_check.py, the sampling half of the GPU check, runs on a CPU too: the
sampler's and the learner's log-probs of restricted tokens agree, and a mismatch fails it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def test_sampling_check_passes_on_cpu(_private_cache):
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--backends", "hf",
                           "--episodes", "4"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu_check-sampling hf: ok" in done.stdout and done.stdout.rstrip().endswith("gpu_check-sampling: ok")


def test_sampling_check_fails_when_the_learner_sees_other_logprobs(monkeypatch, _private_cache):
    """The control: a learner at another temperature than the sampler's gives other log-probs."""
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_check

    from hp_agent.policies import LoadOptions

    real = gpu_check.ActionLogprobs
    monkeypatch.setattr(gpu_check, "ActionLogprobs", lambda model, temperature, *rest: real(model, 2.0, *rest))
    found = gpu_check.probe("tiny", LoadOptions("cpu", "float32"), episodes=4, max_new_tokens=12)
    assert found["mean_abs_dlogp"] > gpu_check.MAX_MEAN_ABS_DELTA["float32"]
