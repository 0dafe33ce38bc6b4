"""The memory plan (hp_agent.memory_plan): from config.json alone, what a configuration
needs per device; ``hp-agent train --plan`` prints it and every run checks it first."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hp_agent import memory_plan
from hp_agent.cli import app
from hp_agent.config import load_config
from hp_agent.errors import UserValueError
from hp_agent.memory_plan import GIB, plan_memory, what_fits

QWEN3 = Path(__file__).parent / "data" / "qwen3"
H100 = 80 * GIB
runner = CliRunner()


def qwen3(size: str) -> dict:
    return json.loads((QWEN3 / f"Qwen3-{size}" / "config.json").read_text())


def plan(size: str, overrides: list[str], world_size: int = 1, device_bytes: int = H100) -> memory_plan.MemoryPlan:
    return plan_memory(qwen3(size), load_config(overrides=overrides, cuda=True), world_size, device_bytes)


def printer():
    spec = importlib.util.spec_from_file_location("memory_plan_script", Path(__file__).parents[1] / "scripts" / "memory_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_the_config_files_give_the_published_parameter_counts():
    assert [memory_plan.parameter_counts(memory_plan.ModelShape.from_config(qwen3(s))).total for s in ("1.7B", "4B", "8B")] \
        == [1_720_574_976, 4_022_468_096, 8_190_735_360]


def test_the_chunk_constant_is_the_kernels_default():
    from hp_agent import kernels

    assert inspect.signature(kernels.chunked_jsd_from_logits).parameters["chunk_elements"].default \
        == memory_plan.JSD_CHUNK_ELEMENTS


def test_full_8b_on_one_80_gib_gpu_is_refused_naming_lora():
    full = plan("8B", [])
    assert not full.fits
    fitting = what_fits(qwen3("8B"), load_config(cuda=True), 1, H100, 1)
    assert [a.label for a, _ in fitting] == ["--lora-rank 16"]
    assert "--lora-rank 16" in memory_plan.refusal("Qwen3-8B", full, fitting)


def test_lora_8b_on_one_and_fsdp2_8b_over_eight_80_gib_gpus_fit():
    assert plan("8B", ["model.lora_rank=16"]).fits
    assert plan("8B", ["learner.parallel=fsdp2", "learner.activation_checkpointing=true"], world_size=8).fits


def test_the_figures_are_the_scripts():
    script = printer()
    eight = next(m for m in script.QWEN3 if m.name == "Qwen3-8B")
    for label, overrides, world_size in script.SETUPS:
        row = script.setup_row(eight, overrides, world_size)
        ours = plan("8B", script.VLLM + overrides + script.CKPT, world_size)
        assert row[9] == pytest.approx(ours.peak / GIB), label
    assert script.counts(eight)["total"] == 8_190_735_360  # scripts/random_qwen3.py reads these


def test_directions():
    def part(p, name):
        return p.components.get(name, 0)

    small, large = plan("4B", ["learner.micro_batch_tokens=2048"]), plan("4B", ["learner.micro_batch_tokens=4096"])
    assert part(small, "activations") < part(large, "activations")
    assert part(plan("4B", ["learner.activation_checkpointing=true"]), "activations") < part(large, "activations")
    assert part(plan("4B", ["model.lora_rank=16"]), "AdamW state") < part(large, "AdamW state")
    fsdp = ["learner.parallel=fsdp2"]
    assert plan("4B", fsdp, world_size=8).peak < plan("4B", fsdp, world_size=2).peak < plan("4B", fsdp, world_size=1).peak
    one, ddp = plan("4B", []), plan("4B", [], world_size=8)
    # DDP replicates, and its reducer's buckets add a second copy of the (fp32) gradients
    assert ddp.peak - one.peak == one.components["gradients"] == 4_022_468_096 * 4
    assert ddp.components["gradients + DDP buckets"] == 2 * one.components["gradients"]


def test_fsdp2_keeps_the_root_unit_and_its_gradient_gathered():
    """The root (embedding, untied LM head, final norm) stays unsharded through forward and
    backward: 8B's is 1.24 B parameters, gathered in bf16 with a bf16 gradient."""
    shape = memory_plan.ModelShape.from_config(qwen3("8B"))
    counts = memory_plan.parameter_counts(shape)
    root = 2 * counts.embedding + shape.hidden
    eight, sixteen = (plan("8B", ["learner.parallel=fsdp2"], world_size=n) for n in (8, 16))
    # what does not shrink with more ranks: the gathered root and two layers, the root's and one layer's gradient
    fixed_copy = 2 * (root + 2 * counts.layer)
    assert 8 * eight.components["FSDP2 shards + gathered units"] - 8 * fixed_copy \
        == pytest.approx(16 * sixteen.components["FSDP2 shards + gathered units"] - 16 * fixed_copy, abs=16)
    assert eight.components["gradients"] - sixteen.components["gradients"] \
        == pytest.approx(counts.total * 4 / 16, abs=2)
    assert sixteen.components["gradients"] > 2 * root + 4 * counts.layer


def test_vllm_without_kv_cache_gb_takes_its_share_of_the_gpu():
    share = plan("1.7B", ["model.backend=vllm"]).components["vLLM engine"]
    assert share == int(load_config(cuda=True).model.vllm.gpu_memory_utilization * H100)


def test_cli_plan_refuses_full_8b_on_1x80_in_one_line_and_accepts_lora():
    model = str(QWEN3 / "Qwen3-8B")  # config.json only: loading weights or a tokenizer would fail
    refused = runner.invoke(app, ["train", "--plan", "--plan-for", "1x80", "--model", model])
    assert refused.exit_code == 2, refused.output
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--lora-rank 16" in errors[0] and "Traceback" not in refused.output
    accepted = runner.invoke(app, ["train", "--plan", "--plan-for", "1x80", "--model", model, "--lora-rank", "16"])
    assert accepted.exit_code == 0, accepted.output
    assert "fits" in accepted.output and "AdamW state" in accepted.output


def test_cli_plan_for_must_agree_with_nproc():
    result = runner.invoke(app, ["train", "--plan", "--plan-for", "8x80", "--nproc", "4", "--model", str(QWEN3 / "Qwen3-8B")])
    assert result.exit_code == 2 and "--nproc 4" in result.output


def test_the_tiny_model_passes_the_check():
    config = load_config(overrides=["env.name=keys"])
    assert memory_plan.check_memory(config, 1).fits


def test_train_refuses_before_anything_loads(monkeypatch, tmp_path):
    from hp_agent import trainer

    monkeypatch.setattr(memory_plan, "available_bytes", lambda device: 1 << 20)

    def no_env(*args, **kwargs):
        raise AssertionError("an env was built")

    monkeypatch.setattr(trainer, "InlineRollouts", no_env)
    monkeypatch.setattr(trainer, "RolloutProcess", no_env)
    with pytest.raises(UserValueError, match="needs .* per device") as error:
        trainer.train(overrides=["env.name=keys", f"trainer.run_dir={tmp_path}", "trainer.name=run"], progress=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()
