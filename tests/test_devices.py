"""``auto`` device and dtype: resolved for the machine (or the one a plan is for), recorded
resolved, and a device that is not there refused in one line."""

from __future__ import annotations

import pytest
import torch

from hp_agent.config import load_config
from hp_agent.devices import check_device, resolve_device, resolve_dtype
from hp_agent.errors import UserValueError
from hp_agent.sft import sft


def test_auto_is_cuda_and_bfloat16_with_a_gpu_and_cpu_and_float32_without():
    assert resolve_device("auto", cuda=True) == "cuda" and resolve_device("auto", cuda=False) == "cpu"
    assert resolve_device("cuda:1", cuda=False) == "cuda:1"  # a named device is kept, to be checked
    assert resolve_dtype("auto", "cuda:3") == "bfloat16" and resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("float16", "cpu") == "float16"
    with pytest.raises(UserValueError, match="'float8'.*bfloat16"):
        resolve_dtype("float8", "cpu")


def test_a_run_config_records_what_auto_resolved_to_and_trains_master_weights_on_a_gpu():
    gpu, cpu = load_config(cuda=True), load_config(cuda=False)
    assert (gpu.model.device, gpu.model.dtype, gpu.learner.mixed_precision) == ("cuda", "bfloat16", True)
    assert (cpu.model.device, cpu.model.dtype, cpu.learner.mixed_precision) == ("cpu", "float32", False)
    here = load_config()
    assert here.model.device == ("cuda" if torch.cuda.is_available() else "cpu")
    explicit = load_config(overrides=["model.dtype=bfloat16", "model.device=cpu"], cuda=True)
    assert (explicit.model.device, explicit.model.dtype, explicit.learner.mixed_precision) == ("cpu", "bfloat16", True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_one_is_one_line_naming_the_cpu():
    with pytest.raises(UserValueError) as error:
        check_device("cuda")
    message = str(error.value)
    assert "\n" not in message and "no usable GPU" in message and "devices here: cpu" in message
    check_device("cpu")
    with pytest.raises(UserValueError, match="'tpu'"):
        check_device("tpu")


def test_sft_in_bfloat16_computes_under_autocast_on_float32_weights(tmp_path, _private_cache):
    result = sft(tmp_path / "warm", env="keys", model="tiny", steps=3, batch_size=4, device="cpu", dtype="bfloat16")
    from safetensors.torch import load_file

    weights = load_file(str(next(result.out_dir.glob("*.safetensors"))))
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    assert result.first_loss == result.first_loss and result.last_loss < result.first_loss + 1.0  # finite, not diverged
    # the compute did run in bfloat16: the same first batch's loss in float32 differs by bf16 rounding, and only by it
    float32 = sft(tmp_path / "warm32", env="keys", model="tiny", steps=3, batch_size=4, device="cpu", dtype="float32")
    assert 1e-5 < abs(result.first_loss - float32.first_loss) < 0.05 * float32.first_loss
