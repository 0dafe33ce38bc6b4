"""Memory per device of one training configuration, worked out from a model's config.json.

Pure arithmetic over the model's shape (:class:`ModelShape`, read from ``config.json``:
no weights, no torch) and a resolved :class:`~hp_agent.config.TrainConfig`: every
component a run keeps on one device, in bytes, and the peak (docs/scale.md, "Formulas and
assumptions", gives the reasoning and the checks behind each formula; the assumptions are
repeated in the docstrings here). ``hp-agent train --plan`` prints a plan, ``train()``
refuses a run whose plan does not fit before it loads anything, and scripts/memory_plan.py
prints docs/scale.md's tables from the same functions.

Parameter counts assume the Qwen3 decoder layout (q, k, v, o projections, q_norm and
k_norm, gate/up/down MLP, two RMSNorms per layer); a Llama-style model without q_norm and
k_norm is counted 2 x head_dim parameters per layer too many, which is negligible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hp_agent.config import TrainConfig

GIB = 1 << 30
# What a plan may use of a device's memory: the plan does not count the CUDA context,
# allocator fragmentation, NCCL buffers or kernel workspaces (docs/scale.md plans to ~90%).
USABLE_FRACTION = 0.9
# The default of hp_agent.kernels' row chunk (chunked_jsd_from_logits' chunk_elements), kept
# here so that planning imports no torch; tests/test_memory_plan.py checks they still agree.
JSD_CHUNK_ELEMENTS = 1 << 23
# The vLLM engine's KV cache where model.vllm.kv_cache_gb is None off CUDA (VLLMConfig).
CPU_KV_CACHE_GB = 1.0
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4


@dataclass(frozen=True)
class ModelShape:
    """The config.json fields a memory plan needs."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    max_positions: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a config.json dict; head_dim and num_key_value_heads default as transformers'
        do (hidden / heads, heads), tie_word_embeddings to PretrainedConfig's True."""
        from hp_agent.errors import UserValueError

        required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [key for key in required if not isinstance(config.get(key), int)]
        if missing:
            raise UserValueError(f"config.json lacks {', '.join(missing)}: no memory plan for this model "
                                 "(trainer.check_memory=false skips the check)")
        heads = config["num_attention_heads"]
        return cls(hidden=config["hidden_size"], intermediate=config["intermediate_size"],
                   layers=config["num_hidden_layers"], heads=heads,
                   kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads, vocab=config["vocab_size"],
                   tied=bool(config.get("tie_word_embeddings", True)),
                   max_positions=config.get("max_position_embeddings") or 0)

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


# --- parameter counts ------------------------------------------------------------------

@dataclass(frozen=True)
class ParameterCounts:
    layer: int
    embedding: int
    total: int
    non_embedding: int


def parameter_counts(m: ModelShape) -> ParameterCounts:
    """Per layer q, k, v, o, q_norm and k_norm, gate, up, down and two RMSNorms; the embedding,
    the final norm, and an lm_head only where the embedding is not tied."""
    attention = 2 * m.hidden * m.q_width + 2 * m.hidden * m.kv_width + 2 * m.head_dim
    layer = attention + 3 * m.hidden * m.intermediate + 2 * m.hidden
    embedding = m.vocab * m.hidden
    non_embedding = m.layers * layer + m.hidden
    return ParameterCounts(layer, embedding, embedding + non_embedding + (0 if m.tied else embedding), non_embedding)


def projection_shapes(m: ModelShape) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear layer of a decoder layer, by its module name."""
    return {"q_proj": (m.hidden, m.q_width), "k_proj": (m.hidden, m.kv_width), "v_proj": (m.hidden, m.kv_width),
            "o_proj": (m.q_width, m.hidden), "gate_proj": (m.hidden, m.intermediate),
            "up_proj": (m.hidden, m.intermediate), "down_proj": (m.intermediate, m.hidden)}


def lora_layer_params(m: ModelShape, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    """One decoder layer's adapter: r (d_in + d_out) for each target projection (peft's A and B)."""
    shapes = projection_shapes(m)
    return sum(rank * sum(shapes[name]) for name in targets if name in shapes)


QWEN3_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_params(m: ModelShape, rank: int, targets: list[str] | tuple[str, ...] = QWEN3_PROJECTIONS) -> int:
    return lora_layer_params(m, rank, targets) * m.layers


def kv_bytes_per_token(m: ModelShape) -> int:
    return 2 * m.layers * m.kv_width * 2  # K and V, bf16


# --- activations and phases ------------------------------------------------------------

def act_layer_bytes_per_token(m: ModelShape) -> int:
    """Tensors one decoder layer saves for backward, bf16 with SDPA (no T x T scores): two
    RMSNorms 4h each (fp32 input 2h + normalized h + output h, in bf16 units), q 4q
    (projection, q_norm's fp32 copy 2q, RoPE output), k 3kv + q (repeated to all heads:
    transformers repeats K/V when a padding mask is passed), v q (repeated), attention
    output q, MLP 4i (gate, silu(gate), up, product). Checked against autograd's saved
    tensors on a small random Qwen3 (within 4%, the rest being the final norm)."""
    return 2 * (8 * m.hidden + 7 * m.q_width + 3 * m.kv_width + 4 * m.intermediate)


def activations(m: ModelShape, tokens: int, checkpointing: bool) -> int:
    """Saved activations of a micro-batch of ``tokens`` padded tokens; with checkpointing the
    layer inputs (2h bytes per token and layer) plus one layer recomputed in backward."""
    layer = act_layer_bytes_per_token(m) * tokens
    final_norm = 8 * m.hidden * tokens
    if not checkpointing:
        return m.layers * layer + final_norm
    return m.layers * 2 * m.hidden * tokens + layer + final_norm


def packed_mask(tokens: int) -> int:
    """learner.packed: the pass's boolean prefix-tree mask, [rows, width, width] with rows x
    width <= tokens, so at most tokens^2 bytes (one row as wide as the micro-batch)."""
    return tokens * tokens


def learner_logits(m: ModelShape, tokens: int, chunk_tokens: int) -> int:
    """chosen_logprobs keeps each chunk's fp32 logits for backward, so every action token of
    the micro-batch holds V x 4 bytes until backward (bound: all tokens are action tokens),
    plus one chunk's backward transients (fp32 grad, bf16 grad; ``learner.logit_chunk_tokens``)."""
    return tokens * m.vocab * 4 + min(chunk_tokens, tokens) * m.vocab * (4 + 2 + 2)


def jsd_chunk(m: ModelShape, chunk_tokens: int) -> int:
    """Scoring (no grad): two [jsd_chunk_tokens, V] bf16 logits, the LM head's output before
    the temperature division, and the row-chunk temporaries (7 x 4 x chunk_elements bytes)."""
    return 3 * chunk_tokens * m.vocab * 2 + 7 * 4 * JSD_CHUNK_ELEMENTS


def scoring_forward(m: ModelShape, tokens: int) -> int:
    """No-grad forward of ``tokens``: one layer's live tensors and the 4-D bf16 mask."""
    return tokens * (4 * m.hidden + 2 * m.q_width + 2 * m.kv_width + 3 * m.intermediate) * 2 + tokens**2 * 2


# --- the plan --------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one configuration: ``components`` by name (zero ones left out),
    ``peak`` as docs/scale.md defines it, ``device_bytes`` what the device offers."""

    components: dict[str, int]
    peak: int
    device_bytes: int
    world_size: int
    notes: tuple[str, ...] = field(default=())

    @property
    def usable_bytes(self) -> int:
        return int(self.device_bytes * USABLE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable_bytes


@dataclass(frozen=True)
class _Training:
    """What the learner keeps between steps (bytes per device)."""

    weights: int  # the model that rolls out and scores (for LoRA with its fp32 adapter)
    master: int  # the learner's separate copy: fp32 master weights, FSDP2 shards and gathered units
    gradients: int
    adamw: int


def _training_state(m: ModelShape, config: TrainConfig, world_size: int) -> _Training:
    """Weights, the learner's copy, gradients and AdamW state on one device.

    Mirrors hp_agent.parallel.TrainModel: with mixed precision and trained weights that are
    not float32 the learner trains a float32 copy (``needs_fp32_copy``); FSDP2 over several
    ranks always trains a separate copy, sharded, keeping the full model that rolls out and
    scores on every rank, plus, gathered: the root unit (embedding, final norm, an untied LM
    head), which fully_shard keeps unsharded from forward through backward, and its
    gradient, reduce-scattered only when backward ends; a decoder layer current and one
    prefetched, and one layer's gradient before its reduce-scatter. DDP replicates
    everything and its reducer's buckets hold a second copy of the gradients. LoRA: a
    frozen base and an fp32 adapter (peft), so no fp32 copy. ``torch.optim.AdamW`` keeps m
    and v in the trained parameters' dtype.
    """
    counts = parameter_counts(m)
    model_bytes = DTYPE_BYTES[config.model.dtype]
    mixed = bool(config.learner.mixed_precision)
    lora = config.model.lora_rank
    adapter = lora_params(m, lora, config.model.lora_target_modules) if lora else 0
    weights = counts.total * model_bytes + adapter * FP32
    trained = adapter if lora else counts.total
    trained_bytes = FP32 if lora else model_bytes
    fp32_copy = mixed and trained_bytes != FP32
    if fp32_copy:
        trained_bytes = FP32
    gradients = trained * trained_bytes
    if world_size == 1 or config.learner.parallel == "ddp":
        master = counts.total * FP32 if fp32_copy else 0
        buckets = gradients if world_size > 1 else 0  # DDP's reducer copies each gradient into a bucket
        return _Training(weights, master, gradients + buckets, 2 * gradients)
    copy_bytes = (counts.total * model_bytes + adapter * FP32) if lora else counts.total * trained_bytes
    root = counts.embedding * (1 if m.tied else 2) + m.hidden
    layer_trained = lora_layer_params(m, lora, config.model.lora_target_modules) if lora else counts.layer
    root_trained = 0 if lora else root
    compute_bytes = 2 if mixed else trained_bytes  # FSDP2's MixedPrecisionPolicy gathers bf16
    gathered = compute_bytes * (root + 2 * counts.layer)
    unsharded_gradients = compute_bytes * root_trained + trained_bytes * layer_trained
    return _Training(weights, copy_bytes // world_size + gathered, gradients // world_size + unsharded_gradients,
                     2 * gradients // world_size)


def _rollout_share(m: ModelShape, config: TrainConfig, device_bytes: int, notes: list[str]) -> int:
    """vllm: the engine's bf16 (engine dtype) copy plus ``kv_cache_gb`` of KV cache; with
    kv_cache_gb None on CUDA the engine takes gpu_memory_utilization x device memory for
    weights, activations and KV together (1 GiB of KV off CUDA). hf: the prefix cache,
    ``prefix_cache_tokens`` x KV bytes per token. Its workspace is not counted."""
    if config.model.backend == "hf":
        return config.model.prefix_cache_tokens * kv_bytes_per_token(m)
    vllm = config.model.vllm
    engine_weights = parameter_counts(m).total * DTYPE_BYTES.get(str(vllm.engine_kwargs.get("dtype", config.model.dtype)), 2)
    if vllm.kv_cache_gb is not None:
        return engine_weights + int(vllm.kv_cache_gb * GIB)
    if not config.model.device.startswith("cuda"):
        return engine_weights + int(CPU_KV_CACHE_GB * GIB)
    share = int(vllm.gpu_memory_utilization * device_bytes)
    if share <= engine_weights:
        notes.append(f"model.vllm.gpu_memory_utilization={vllm.gpu_memory_utilization} leaves the engine no KV cache "
                     f"({share / GIB:.1f} GiB for {engine_weights / GIB:.1f} GiB of weights)")
    return max(share, engine_weights)


def plan_memory(model_config: dict[str, Any], config: TrainConfig, world_size: int, device_bytes: int) -> MemoryPlan:
    """The plan of ``config`` (resolved: model.device and dtype not auto) over ``world_size``
    devices of ``device_bytes`` each, for the model whose config.json is ``model_config``.

    Peak: gradients stay allocated from one optimizer step to the next (zero_grad with
    set_to_none runs at the start of a step), so it is weights + gradients + AdamW + the
    rollout share + the larger of the learner phase (activations + logits) and the scoring
    phase (JSD chunk + a no-grad forward of hindsight.score_batch_tokens). With
    model.vllm.sleep the engine's share is freed while scoring and the learner run. With
    trainer.off_policy_steps >= 1 (hf only) a rollout process on the same device holds its
    own copy and prefix cache and plays (and scores the 1 - learner_scoring_share rest);
    with learner_scoring_share > 0 the learner's process holds a scoring copy too.
    """
    m = ModelShape.from_config(model_config)
    notes: list[str] = []
    state = _training_state(m, config, world_size)
    tokens = config.learner.micro_batch_tokens
    acts = activations(m, tokens, config.learner.activation_checkpointing)
    acts += packed_mask(tokens) if config.learner.packed else 0
    logits = learner_logits(m, tokens, config.learner.logit_chunk_tokens)
    scoring = scoring_forward(m, config.hindsight.score_batch_tokens)
    scoring += jsd_chunk(m, config.hindsight.jsd_chunk_tokens) if config.scores_hindsight else 0
    persistent = state.weights + state.master + state.gradients + state.adamw
    sharded = config.learner.parallel == "fsdp2" and world_size > 1
    components = {"weights": state.weights, ("FSDP2 shards + gathered units" if sharded else "fp32 master copy"): state.master,
                  ("gradients + DDP buckets" if world_size > 1 and not sharded else "gradients"): state.gradients,
                  "AdamW state": state.adamw}
    learner_phase = acts + logits
    if config.trainer.off_policy_steps:
        share = config.trainer.learner_scoring_share
        scoring_copy = state.weights if share > 0 else 0
        learner_side = persistent + scoring_copy + (max(learner_phase, scoring) if share > 0 else learner_phase)
        rollout_process = state.weights + _rollout_share(m, config, device_bytes, notes) + (scoring if share < 1 else 0)
        components |= {"scoring copy": scoring_copy, "activations": acts, "learner logits": logits,
                       "scoring phase": scoring, "rollout process": rollout_process}
        peak = learner_side + rollout_process
    else:
        rollout = _rollout_share(m, config, device_bytes, notes)
        components |= {("vLLM engine" if config.model.backend == "vllm" else "prefix cache"): rollout,
                       "activations": acts, "learner logits": logits, "scoring phase": scoring}
        peak = persistent + rollout + max(learner_phase, scoring)
        if config.model.backend == "vllm" and config.model.vllm.sleep:
            peak = max(persistent + rollout, persistent + max(learner_phase, scoring))
    return MemoryPlan({k: v for k, v in components.items() if v}, peak, device_bytes, world_size, tuple(notes))


# --- refusing what does not fit, naming what would -------------------------------------

@dataclass(frozen=True)
class Alternative:
    """A change to try: how the user asks for it (``label``) and the overrides it makes."""

    label: str
    overrides: tuple[str, ...]
    world_size: int | None = None  # None: the plan's own


def alternatives(config: TrainConfig, devices: int) -> list[Alternative]:
    """Changes that save memory, cheapest first: those that cost no quality and little speed
    (sleep, checkpointing, a smaller micro-batch: the same update), then more GPUs, then LoRA
    (another method). ``devices``: GPUs there are to shard over."""
    out = []
    if config.model.backend == "vllm" and config.model.device.startswith("cuda") and not config.model.vllm.sleep:
        out.append(Alternative("model.vllm.sleep=true", ("model.vllm.sleep=true",)))
    if not config.learner.activation_checkpointing:
        out.append(Alternative("learner.activation_checkpointing=true", ("learner.activation_checkpointing=true",)))
    tokens = config.learner.micro_batch_tokens // 2
    while tokens >= 512:  # the largest that fits is found first
        out.append(Alternative(f"learner.micro_batch_tokens={tokens}", (f"learner.micro_batch_tokens={tokens}",)))
        tokens //= 2
    if devices > 1 and config.learner.parallel != "fsdp2":
        out.append(Alternative(f"--nproc {devices} learner.parallel=fsdp2", ("learner.parallel=fsdp2",), devices))
    if not config.model.lora_rank:
        out.append(Alternative("--lora-rank 16", ("model.lora_rank=16",)))
    return out


def _with(config: TrainConfig, overrides: tuple[str, ...]) -> TrainConfig:
    from hp_agent.config import load_config

    return load_config(base=config.model_dump(), overrides=list(overrides))


def what_fits(model_config: dict[str, Any], config: TrainConfig, world_size: int, device_bytes: int,
              devices: int) -> list[tuple[Alternative, MemoryPlan]]:
    """Each single alternative that fits, cheapest first (of the micro-batch sizes the largest
    alone); where none does, the first cumulative combination that does (or nothing)."""
    found: list[tuple[Alternative, MemoryPlan]] = []
    tried = alternatives(config, devices)
    for alternative in tried:
        if alternative.label.startswith("learner.micro_batch_tokens") and any(
                a.label.startswith("learner.micro_batch_tokens") for a, _ in found):
            continue
        plan = plan_memory(model_config, _with(config, alternative.overrides), alternative.world_size or world_size,
                           device_bytes)
        if plan.fits:
            found.append((alternative, plan))
    if found:
        return found
    chosen: list[Alternative] = []
    for alternative in tried:
        chosen = [a for a in chosen if not a.label.startswith("learner.micro_batch_tokens")
                  or not alternative.label.startswith("learner.micro_batch_tokens")] + [alternative]
        combined = Alternative(" ".join(a.label for a in chosen), tuple(o for a in chosen for o in a.overrides),
                               next((a.world_size for a in chosen if a.world_size), None))
        plan = plan_memory(model_config, _with(config, combined.overrides), combined.world_size or world_size,
                           device_bytes)
        if plan.fits:
            return [(combined, plan)]
    return []


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def refusal(model: str, plan: MemoryPlan, fitting: list[tuple[Alternative, MemoryPlan]]) -> str:
    """The one line that stops a run whose plan does not fit."""
    head = (f"{model} needs {gib(plan.peak)} per device and {gib(plan.usable_bytes)} is usable "
            f"({USABLE_FRACTION:.0%} of {gib(plan.device_bytes)}; hp-agent train --plan lists the parts)")
    if not fitting:
        return head + "; nothing tried fits (LoRA, FSDP2, checkpointing, a smaller micro-batch): use a smaller model or more GPUs"
    return head + "; would fit: " + "; or ".join(f"{a.label} ({gib(p.peak)})" for a, p in fitting)


def plan_lines(model: str, plan: MemoryPlan) -> list[str]:
    """The plan as a table, component by component, then the peak against the device."""
    width = max(len(name) for name in plan.components)
    lines = [f"memory plan per device: {model}, {plan.world_size} device(s) of {gib(plan.device_bytes)}"]
    lines += [f"  {name:<{width}}  {value / GIB:8.2f} GiB" for name, value in plan.components.items()]
    lines.append(f"  {'peak':<{width}}  {plan.peak / GIB:8.2f} GiB of {plan.usable_bytes / GIB:.2f} GiB usable "
                 f"({USABLE_FRACTION:.0%}): {'fits' if plan.fits else 'does NOT fit'}")
    return lines + [f"  note: {note}" for note in plan.notes]


# --- this machine ----------------------------------------------------------------------

def model_config_dict(name: str) -> dict[str, Any]:
    """config.json of model ``name`` (a local folder, an adapter's base, a run folder, a hub
    id), without its weights."""
    import json

    from hp_agent.policies.resolve import model_config_file

    return json.loads(model_config_file(name).read_text())


def available_bytes(device: str) -> int:
    """Free memory of ``device``: torch.cuda.mem_get_info on CUDA; on the CPU, MemAvailable of
    /proc/meminfo (host RAM) shared by the ranks on this machine (torchrun's LOCAL_WORLD_SIZE)."""
    import os

    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or os.environ.get("LOCAL_RANK", 0))
        return torch.cuda.mem_get_info(index)[0]
    from pathlib import Path

    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    raise OSError("no MemAvailable in /proc/meminfo")


def device_count(device: str) -> int:
    """GPUs here to shard over (1 off CUDA)."""
    if not device.startswith("cuda"):
        return 1
    import torch

    return torch.cuda.device_count()


def check_memory(config: TrainConfig, world_size: int) -> MemoryPlan:
    """Plan ``config`` against this device's free memory; a one-line UserValueError naming
    what would fit where it does not."""
    from hp_agent.errors import UserValueError

    model_config = model_config_dict(config.model.name)
    free = available_bytes(config.model.device)
    plan = plan_memory(model_config, config, world_size, free)
    if not plan.fits:
        fitting = what_fits(model_config, config, world_size, free, device_count(config.model.device))
        raise UserValueError(refusal(config.model.name, plan, fitting) + " (trainer.check_memory=false skips this check)")
    return plan
