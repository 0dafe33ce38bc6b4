"""Per-GPU memory plan for Qwen3-1.7B, 4B and 8B with hp_agent (docs/scale.md prints what this prints).

Offline and fast: no model download, no torch import. A thin printer over
:mod:`hp_agent.memory_plan` (the arithmetic ``hp-agent train --plan`` and every run's
memory check use), with the toolkit's defaults read from its config objects and the
model shapes from the published config.json files in tests/data/qwen3 (sources in
docs/scale.md). Every size is in GiB (2**30 bytes).

Usage: .venv/bin/python scripts/memory_plan.py
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from hp_agent.config import TrainConfig, load_config
from hp_agent.memory_plan import (GIB, JSD_CHUNK_ELEMENTS, MemoryPlan, ModelShape, act_layer_bytes_per_token,
                                  jsd_chunk, kv_bytes_per_token, lora_params, parameter_counts, plan_memory,
                                  scoring_forward)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "qwen3"
LORA_RANKS = (16, 64)
GPUS = 8
KV_CACHE_GB = 1.0  # the tables' vLLM KV cache (model.vllm.kv_cache_gb)
DEVICE_BYTES = 80 * GIB  # only read where kv_cache_gb is None; the tables set it


@dataclass(frozen=True)
class Shape(ModelShape):
    name: str = ""
    published: str = ""  # model card's "Number of Parameters"
    config: str = ""  # its config.json as text


def _load(name: str, published: str) -> Shape:
    text = (CONFIGS / name / "config.json").read_text()
    return Shape(**asdict(ModelShape.from_config(json.loads(text))), name=name, published=published, config=text)


QWEN3 = [_load("Qwen3-1.7B", "1.7B"), _load("Qwen3-4B", "4.0B"), _load("Qwen3-8B", "8.2B")]
VOCAB = QWEN3[0].vocab


def counts(m: ModelShape) -> dict[str, int]:
    c = parameter_counts(m)
    return {"layer": c.layer, "embedding": c.embedding, "total": c.total, "non_embedding": c.non_embedding}


# (label, overrides, world size) of the per-model tables' rows
SETUPS = [
    ("full FT, 1 GPU, bf16 weights and AdamW (model.dtype=bfloat16)", ["model.dtype=bfloat16", "learner.mixed_precision=false"], 1),
    ("full FT, 1 GPU, mixed precision (model.dtype=float32)",
     ["model.dtype=float32", "learner.mixed_precision=true", "model.vllm.engine_kwargs={dtype: bfloat16}"], 1),
    (f"full FT, FSDP2 x {GPUS}, mixed (model.dtype=bfloat16)",
     ["model.dtype=bfloat16", "learner.mixed_precision=true", "learner.parallel=fsdp2"], GPUS),
    (f"LoRA r={LORA_RANKS[0]}, 1 GPU, mixed (model.dtype=bfloat16)",
     [f"model.lora_rank={LORA_RANKS[0]}", "model.dtype=bfloat16", "learner.mixed_precision=true"], 1),
]
VLLM = ["model.backend=vllm", f"model.vllm.kv_cache_gb={KV_CACHE_GB}"]
CKPT = ["learner.activation_checkpointing=true"]


def config_for(overrides: list[str]) -> TrainConfig:
    return load_config(overrides=overrides, cuda=True)


def plan(m: Shape, overrides: list[str], world_size: int = 1) -> MemoryPlan:
    return plan_memory(json.loads(m.config), config_for(overrides), world_size, DEVICE_BYTES)


def part(p: MemoryPlan, *names: str) -> float:
    return sum(p.components.get(name, 0) for name in names) / GIB


WEIGHTS = ("weights", "fp32 master copy", "FSDP2 shards + gathered units")


def setup_row(m: Shape, overrides: list[str], world_size: int) -> list[float]:
    """weights, grads, AdamW, act, act ckpt, logits, JSD, vLLM, total, total ckpt, ckpt + sleep (GiB)."""
    base, ckpt = plan(m, VLLM + overrides, world_size), plan(m, VLLM + overrides + CKPT, world_size)
    sleep = plan(m, VLLM + overrides + CKPT + ["model.vllm.sleep=true"], world_size)
    jsd = jsd_chunk(m, config_for([]).hindsight.jsd_chunk_tokens) / GIB
    return [part(base, *WEIGHTS), part(base, "gradients"), part(base, "AdamW state"), part(base, "activations"),
            part(ckpt, "activations"), part(base, "learner logits"), jsd, part(base, "vLLM engine"),
            base.peak / GIB, ckpt.peak / GIB, sleep.peak / GIB]


def main() -> None:
    d = config_for([])
    print(f"toolkit defaults: learner.micro_batch_tokens={d.learner.micro_batch_tokens}, "
          f"hindsight.jsd_chunk_tokens={d.hindsight.jsd_chunk_tokens}, hindsight.score_batch_tokens={d.hindsight.score_batch_tokens}, "
          f"model.prefix_cache_tokens={d.model.prefix_cache_tokens}, learner.logit_chunk_tokens={d.learner.logit_chunk_tokens}, "
          f"JSD chunk_elements={JSD_CHUNK_ELEMENTS}; the vLLM rows set model.vllm.kv_cache_gb={KV_CACHE_GB}")
    print()
    print("| model | hidden | inter | layers | heads q/kv | tied | params (computed) | published | non-emb | LoRA r=16 | LoRA r=64 | KV/token | act/token/layer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in QWEN3:
        c = counts(m)
        print(f"| {m.name} | {m.hidden} | {m.intermediate} | {m.layers} | {m.heads}/{m.kv_heads} | {'yes' if m.tied else 'no'} "
              f"| {c['total']:,} | {m.published} | {c['non_embedding'] / 1e9:.2f}B | {lora_params(m, 16):,} | {lora_params(m, 64):,} "
              f"| {kv_bytes_per_token(m) // 1024} KiB | {act_layer_bytes_per_token(m):,} B |")
    heads = ["weights", "grads", "AdamW", "act", "act ckpt", "logits", "JSD", "vLLM", "total", "total ckpt", "ckpt + sleep"]
    for m in QWEN3:
        print()
        print(f"{m.name} (GiB per GPU, micro-batch {d.learner.micro_batch_tokens} tokens, vLLM backend)")
        print()
        print("| setup | " + " | ".join(heads) + " |")
        print("|---|" + "---|" * len(heads))
        for label, overrides, world_size in SETUPS:
            print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in setup_row(m, overrides, world_size)) + " |")
    print()
    print("bf16 weights and AdamW with the hf backend (no vLLM copy; prefix cache at its default), total GiB:")
    print()
    print("| model | prefix cache | micro 4096 | micro 2048 | micro 1024 | micro 1024, model.prefix_cache_tokens=0 |")
    print("|---|---|---|---|---|---|")
    bf16 = SETUPS[0][1]
    for m in QWEN3:
        totals = [plan(m, bf16 + [f"learner.micro_batch_tokens={t}"]).peak / GIB for t in (4096, 2048, 1024)]
        no_prefix = plan(m, bf16 + ["learner.micro_batch_tokens=1024", "model.prefix_cache_tokens=0"]).peak / GIB
        print(f"| {m.name} | {part(plan(m, bf16), 'prefix cache'):.1f} | " + " | ".join(f"{t:.1f}" for t in totals)
              + f" | {no_prefix:.1f} |")
    print()
    print(f"vLLM engine at model.vllm.kv_cache_gb={KV_CACHE_GB:g} and max_model_len=None: KV needed for one sequence of "
          "max_position_embeddings tokens, and tokens the KV budget holds:")
    for m in QWEN3:
        need = m.max_positions * kv_bytes_per_token(m) / GIB
        print(f"  {m.name}: {need:.2f} GiB for {m.max_positions:,} tokens; {KV_CACHE_GB:g} GiB holds "
              f"{int(KV_CACHE_GB * GIB // kv_bytes_per_token(m)):,} tokens")
    print()
    print(f"One-step-off (trainer.off_policy_steps=1, model.backend=hf, micro-batch {d.learner.micro_batch_tokens} tokens, activation "
          "checkpointing): GiB on one rank's GPU, learner process + rollout process, and host GiB for the two "
          "weight slots; colocated hf for comparison:")
    print()
    print("| model | setup | colocated hf | one-step-off, share 0: learner + rollout = GPU | share 0.5 | host slots |")
    print("|---|---|---|---|---|---|")
    for m in QWEN3:
        p, a = counts(m)["total"], lora_params(m, LORA_RANKS[0])
        for (label, overrides, _), trained in ((SETUPS[0], 2 * p), (SETUPS[3], 4 * a)):
            colocated = plan(m, overrides + CKPT).peak / GIB
            cells = []
            for share in (0.0, 0.5):
                off = plan(m, overrides + CKPT + ["trainer.off_policy_steps=1", f"trainer.learner_scoring_share={share}"])
                rollout = part(off, "rollout process")
                cells.append(f"{off.peak / GIB - rollout:.1f} + {rollout:.1f} = {off.peak / GIB:.1f}")
            # host: two shared-memory slots of the trained weights
            print(f"| {m.name} | {label.split(',')[0]} | {colocated:.1f} | {cells[0]} | {cells[1]} | {2 * trained / GIB:.2f} |")
    print()
    print("scoring phase extra (JSD chunk + no-grad forward of score_batch_tokens): "
          + ", ".join(f"{m.name} {(jsd_chunk(m, d.hindsight.jsd_chunk_tokens) + scoring_forward(m, d.hindsight.score_batch_tokens)) / GIB:.1f}"
                      for m in QWEN3) + " GiB")


if __name__ == "__main__":
    main()
