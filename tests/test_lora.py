"""LoRA: a step trains the adapter only; the checkpoint holds the adapter only; the merged
folder and the adapter checkpoint give the adapter model's logits; a resumed run goes on
with the same adapter and optimizer state."""

import json
from functools import partial

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hp_agent.config import ModelConfig, load_config
from hp_agent.learner import Learner, TrainingSample
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.policies.lora import (
    is_peft_model,
    maybe_apply_lora,
    merge_adapter,
    merged_model_folder,
    merged_state_dict,
    save_model,
)
from hp_agent.run_folder import latest_checkpoint, model_source
from hp_agent.runs import save_checkpoint

LORA = ModelConfig(lora_rank=4)


def _learner(policy):
    return Learner.from_config(policy, load_config(overrides=["learner.lr=1e-2", "learner.max_grad_norm=1e9"]))


def _samples(policy, seed=0):
    """Four one-turn trajectories sampled from ``policy``, credit +1 and -1 in turn."""
    torch.manual_seed(seed)
    prompts = [policy.render([{"role": "user", "content": f"What is {k} + {k}?"}]) for k in range(4)]
    generations = policy.generate(prompts, SamplingParams(max_new_tokens=12))
    return [
        [TrainingSample(prompt + g.token_ids, len(prompt), torch.tensor(g.logprobs), torch.full((len(g.token_ids),), (-1.0) ** k))]
        for k, (prompt, g) in enumerate(zip(prompts, generations))
    ]


def _sequences(vocab_size, rows=3, length=12):
    return torch.randint(0, vocab_size, (rows, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _logits(model, ids):
    model.eval()
    return model(input_ids=ids).logits


def _plain(state):
    """A PeftModel's base weights under the plain model's names (adapter tensors left out)."""
    return {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}


@pytest.fixture()
def trained():
    """A tiny policy with a LoRA adapter after one learner step, its learner, the base
    model's weights and logits from before, and the step's samples."""
    policy = load_policy("tiny")
    ids = _sequences(policy.model.config.vocab_size)
    base_state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    base_logits = _logits(policy.model, ids)
    policy = maybe_apply_lora(policy, LORA)
    learner = _learner(policy)
    samples = _samples(policy)
    records = learner.step(samples)
    assert len(records) == 1 and records[0].grad_norm > 0 and not records[0].skipped_nonfinite
    return policy, learner, base_state, base_logits, ids


def test_a_lora_step_changes_the_adapter_and_no_base_weight(trained):
    policy, learner, base_state, base_logits, ids = trained
    model = policy.model
    assert is_peft_model(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    # 7 projections x 2 layers x (A, B); the optimizer holds exactly those tensors
    optimized = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert len(optimized) == len(trainable) and {id(p) for p in optimized} == {id(p) for n, p in model.named_parameters() if n in trainable}
    state = model.state_dict()
    after = _plain(state)
    assert after.keys() == base_state.keys()
    assert all(torch.equal(after[k], base_state[k]) for k in base_state), "a base weight changed"
    lora_b = [v for k, v in state.items() if ".lora_B." in k]
    assert lora_b and all(bool(v.abs().max() > 0) for v in lora_b)  # every adapter learned (B starts at 0)
    assert (_logits(model, ids) - base_logits).abs().max() > 1e-3  # and the adapter is in the forward pass


def test_merged_folder_loads_in_transformers_with_the_adapter_models_logits(trained, tmp_path):
    policy, _, _, base_logits, ids = trained
    folder = merged_model_folder(policy.model, policy.tokenizer, tmp_path / "merged")
    assert (folder / "config.json").is_file() and not (folder / "adapter_config.json").exists()
    merged, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    adapter_logits = _logits(policy.model, ids)
    assert torch.allclose(_logits(merged, ids), adapter_logits, atol=1e-5)
    assert (adapter_logits - base_logits).abs().max() > 1e-3  # the comparison is not base against base
    assert AutoTokenizer.from_pretrained(folder).chat_template == policy.tokenizer.chat_template
    assert is_peft_model(policy.model)  # writing the folder left the training model as it was
    # the in-memory merge is peft's own merge_and_unload, bit for bit
    import copy

    reference = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    ours = merged_state_dict(policy.model)
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)


def test_checkpoint_holds_only_the_adapter_and_loads_back_merged(trained, tmp_path):
    policy, learner, _, _, ids = trained
    run = tmp_path / "run"
    save_checkpoint(run, 1, partial(save_model, policy.model, policy.tokenizer), learner.save, {"step": 1}, keep=2)
    folder = latest_checkpoint(run) / "model"
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert not (folder / "config.json").exists() and not list(folder.glob("model*.safetensors"))
    base_bytes = sum(f.stat().st_size for f in (policy.path).glob("*.safetensors"))
    adapter_bytes = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert adapter_bytes < base_bytes / 10  # tiny: ~0.27 MB against ~11 MB
    assert (latest_checkpoint(run) / "optimizer.pt").stat().st_size < base_bytes / 5  # AdamW state of the adapter only
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    # eval's path: the run folder -> its checkpoint's adapter -> base + adapter, merged
    assert model_source(str(run)) == str(folder)
    loaded = load_policy(str(run))
    assert loaded.adapter_path == folder and not is_peft_model(loaded.model)
    assert torch.allclose(_logits(loaded.model, ids), _logits(policy.model, ids), atol=1e-5)
    # the CLI's path: a plain folder from the run
    merged = merge_adapter(run, tmp_path / "merged")
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(merged), ids), _logits(policy.model, ids), atol=1e-5)
    with pytest.raises(FileExistsError):
        merge_adapter(run, merged)  # never over a folder that holds something


def test_resume_from_a_lora_checkpoint_continues_the_same_adapter(trained, tmp_path):
    policy, learner, base_state, _, _ = trained
    checkpoint = save_checkpoint(tmp_path / "run", 1, partial(save_model, policy.model, policy.tokenizer), learner.save, {"step": 1}, keep=2)
    resumed = maybe_apply_lora(load_policy(str(checkpoint / "model")), LORA)
    assert is_peft_model(resumed.model)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert [n for n, p in resumed.model.named_parameters() if p.requires_grad] == names
    resumed_learner = _learner(resumed)
    resumed_learner.load(checkpoint)
    # the same next step on the original and the resumed run: same weights after
    samples = _samples(policy, seed=3)
    learner.step(samples)
    resumed_learner.step(samples)
    original, again = policy.model.state_dict(), resumed.model.state_dict()
    assert original.keys() == again.keys()
    assert all(torch.allclose(original[k], again[k], atol=1e-6) for k in original)
    assert all(torch.equal(v, base_state[k]) for k, v in _plain(again).items())  # base loaded bit-exact, still frozen


def test_an_adapter_with_other_settings_is_refused_and_a_plain_model_has_nothing_to_merge(trained, tmp_path):
    policy, learner, _, _, _ = trained
    checkpoint = save_checkpoint(tmp_path / "run", 1, partial(save_model, policy.model, policy.tokenizer), learner.save, {"step": 1}, keep=2)
    with pytest.raises(ValueError, match="lora_rank 4 .adapter. vs 8 .config.*merge-lora"):
        maybe_apply_lora(load_policy(str(checkpoint / "model")), ModelConfig(lora_rank=8))
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        merge_adapter("tiny", tmp_path / "out")


def test_config_keys():
    config = load_config(overrides=["model.lora_rank=8", "model.lora_target_modules=[q_proj, v_proj]"])
    assert config.model.lora_rank == 8 and config.model.lora_target_modules == ["q_proj", "v_proj"]
    assert ModelConfig().lora_rank == 0 and "down_proj" in ModelConfig().lora_target_modules
    from hp_agent.policies.lora import lora_config

    assert lora_config(config.model).lora_alpha == 16  # default alpha: 2 r


@pytest.mark.slow
def test_a_lora_run_from_the_command_line_saves_adapters_resumes_evaluates_and_merges(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import hp_agent
    from hp_agent.cli import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    arguments = ["train", "--env", "math", "--lora-rank", "4", "--steps", "2", "--name", "lora", "rollout.max_new_tokens=16",
                 "trainer.prompts_per_step=2", "trainer.checkpoint_every=1", "learner.lr=1e-3"]
    result = runner.invoke(app, arguments)
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "lora"
    assert (run / "config.yaml").read_text().count("lora_rank: 4") == 1
    first = latest_checkpoint(run) / "model"
    assert first.parent.name == "step_000002" and (first / "adapter_config.json").is_file()
    summary = hp_agent.train(resume=run, overrides=["trainer.steps=3"], progress=False)
    assert summary.steps == 3 and (summary.checkpoint / "model" / "adapter_model.safetensors").is_file()
    assert hp_agent.evaluate(env="math", model=str(run), split="test", samples=1, limit=2).tasks == 2
    result = runner.invoke(app, ["merge-lora", str(run), "--out", "merged"])
    assert result.exit_code == 0, result.output
    ids = _sequences(AutoTokenizer.from_pretrained(tmp_path / "merged").vocab_size)
    adapter = load_policy(str(run)).model
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), ids), _logits(adapter, ids), atol=1e-5)
    result = runner.invoke(app, ["merge-lora", "tiny", "--out", "other"])
    assert result.exit_code == 2 and "not a LoRA adapter" in " ".join(result.output.split())
