"""Per-GPU memory plan for Qwen3-1.7B, 4B and 8B with hp_agent (docs/scale.md prints what this prints).

Offline and fast: no model download, no torch import. The toolkit's defaults are read
from the source with ``ast`` (hp_agent/config.py, hp_agent/credit.py,
hp_agent/policies/vllm.py), so the table follows them when they change. The model
shapes are the published config.json values (sources in docs/scale.md). Every size is
in GiB (2**30 bytes).

Usage: .venv/bin/python scripts/memory_plan.py
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
VOCAB = 151_936


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    max_positions: int
    published: str  # model card's "Number of Parameters"


QWEN3 = [
    Shape("Qwen3-1.7B", 2048, 6144, 28, 16, 8, 128, True, 40_960, "1.7B"),
    Shape("Qwen3-4B", 2560, 9728, 36, 32, 8, 128, True, 40_960, "4.0B"),
    Shape("Qwen3-8B", 4096, 12288, 36, 32, 8, 128, False, 40_960, "8.2B"),
]
LORA_RANKS = (16, 64)
GPUS = 8


# --- the toolkit's defaults, read from its source ------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift}


def _const(node: ast.AST):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_const(node.left), _const(node.right))
    raise ValueError(f"not a constant: {ast.dump(node)}")


def field_default(path: str, cls: str, field: str):
    """Default of ``field: T = Field(DEFAULT, ...)`` in class ``cls``."""
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == field:
                    return _const(item.value.args[0])
    raise KeyError(f"{path}: {cls}.{field}")


def arg_default(path: str, function: str, arg: str):
    """Default of argument ``arg`` of ``function`` (a def anywhere in the file)."""
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for a, default in zip(args, node.args.defaults):
                if a.arg == arg:
                    return _const(default)
    raise KeyError(f"{path}: {function}({arg}=...)")


MICRO_TOKENS = field_default("hp_agent/config.py", "LearnerConfig", "micro_batch_tokens")
JSD_CHUNK = field_default("hp_agent/config.py", "HindsightConfig", "jsd_chunk_tokens")
SCORE_TOKENS = field_default("hp_agent/config.py", "HindsightConfig", "score_batch_tokens")
PREFIX_TOKENS = field_default("hp_agent/config.py", "ModelConfig", "prefix_cache_tokens")
LOGPROB_CHUNK = arg_default("hp_agent/credit.py", "chunked_logprobs", "chunk_size")
JSD_ELEMENTS = arg_default("hp_agent/credit.py", "chunked_jsd_from_logits", "chunk_elements")
VLLM_KV_GB = arg_default("hp_agent/policies/vllm.py", "__init__", "kv_cache_gb")


# --- parameter counts ------------------------------------------------------------------

def counts(m: Shape) -> dict[str, int]:
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    attention = m.hidden * q + 2 * m.hidden * kv + q * m.hidden + 2 * m.head_dim  # q,k,v,o + q_norm, k_norm
    mlp = 3 * m.hidden * m.intermediate  # gate, up, down
    layer = attention + mlp + 2 * m.hidden  # + input and post-attention RMSNorm
    embedding = VOCAB * m.hidden
    total = embedding + m.layers * layer + m.hidden + (0 if m.tied else embedding)  # + final norm, lm_head
    return {"layer": layer, "embedding": embedding, "total": total, "non_embedding": m.layers * layer + m.hidden}


def lora_params(m: Shape, rank: int) -> int:
    """r (d_in + d_out) for each of q, k, v, o, gate, up, down in every layer."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    per_layer = (m.hidden + q) + 2 * (m.hidden + kv) + (q + m.hidden) + 2 * (m.hidden + m.intermediate) + (m.intermediate + m.hidden)
    return rank * per_layer * m.layers


def kv_bytes_per_token(m: Shape) -> int:
    return 2 * m.layers * m.kv_heads * m.head_dim * 2  # K and V, bf16


# --- activations -----------------------------------------------------------------------

def act_layer_bytes_per_token(m: Shape) -> int:
    """Tensors one Qwen3 decoder layer saves for backward, bf16 with SDPA (no T x T scores):
    two RMSNorms 4h each (fp32 input 2h + normalized h + output h, in bf16 units), q 4q
    (projection, q_norm's fp32 copy 2q, RoPE output), k 3kv + q (repeated to all heads:
    transformers repeats K/V when a padding mask is passed), v q (repeated), attention
    output q, MLP 4i (gate, silu(gate), up, product). Checked against autograd's saved
    tensors on a small random Qwen3 (within 4%, the rest being the final norm)."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return 2 * (8 * m.hidden + 7 * q + 3 * kv + 4 * m.intermediate)


def activations(m: Shape, tokens: int, checkpointing: bool) -> int:
    layer = act_layer_bytes_per_token(m) * tokens
    final_norm = 8 * m.hidden * tokens
    if not checkpointing:
        return m.layers * layer + final_norm
    return m.layers * 2 * m.hidden * tokens + layer + final_norm  # layer inputs + one layer recomputed


def learner_mask(tokens: int) -> int:
    """learner.packed (the default): the pass's boolean prefix-tree mask, [rows, width,
    width] with rows x width <= tokens, so at most tokens^2 bytes (one row as wide as the
    micro-batch); kept for backward with the attention inputs."""
    return tokens * tokens


def learner_logits(tokens: int) -> int:
    """Learner: chosen_logprobs keeps each chunk's fp32 logits for backward, so every action
    token of the micro-batch holds V x 4 bytes until backward (bound: all tokens are
    action tokens), plus one chunk's backward transients (fp32 grad, bf16 grad)."""
    return tokens * VOCAB * 4 + LOGPROB_CHUNK * VOCAB * (4 + 2 + 2)


def jsd_chunk() -> int:
    """Scoring (no grad): two [jsd_chunk_tokens, V] bf16 logits, the LM head's output before the
    temperature division, and the row-chunk temporaries (7 x 4 x chunk_elements bytes)."""
    return 3 * JSD_CHUNK * VOCAB * 2 + 7 * 4 * JSD_ELEMENTS


def scoring_forward(m: Shape) -> int:
    """No-grad forward of score_batch_tokens: one layer's live tensors and the 4-D bf16 mask."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return SCORE_TOKENS * (4 * m.hidden + 2 * q + 2 * kv + 3 * m.intermediate) * 2 + SCORE_TOKENS**2 * 2


# --- rows ------------------------------------------------------------------------------

def plan(m: Shape, weights: int, grads: int, adam: int, tokens: int = MICRO_TOKENS, backend: str = "vllm") -> dict[str, float]:
    """One setup's GiB per GPU. Persistent: weights, grads (kept from one optimizer step to the
    next: zero_grad(set_to_none) runs at the start of a step), AdamW state and the rollout
    share; on top, the larger of the learner phase (activations + logits) and the scoring
    phase (JSD chunk + no-grad forward)."""
    p = counts(m)["total"]
    rollout = 2 * p + VLLM_KV_GB * GIB if backend == "vllm" else PREFIX_TOKENS * kv_bytes_per_token(m)
    parts = {"weights": weights, "grads": grads, "adam": adam,
             "act": activations(m, tokens, False) + learner_mask(tokens),
             "act_ckpt": activations(m, tokens, True) + learner_mask(tokens),
             "logits": learner_logits(tokens), "jsd": jsd_chunk(), "rollout": rollout}
    fixed = weights + grads + adam + rollout
    scoring = parts["jsd"] + scoring_forward(m)
    parts["total"] = fixed + max(parts["act"] + parts["logits"], scoring)
    parts["total_ckpt"] = fixed + max(parts["act_ckpt"] + parts["logits"], scoring)
    # model.vllm.sleep: the engine's share is freed while scoring and the learner run
    parts["total_sleep"] = max(fixed, fixed - rollout + max(parts["act_ckpt"] + parts["logits"], scoring))
    return {k: v / GIB for k, v in parts.items()}


def setups(m: Shape) -> dict[str, tuple[int, int, int]]:
    """(weights, grads, AdamW) bytes per GPU of each setup."""
    c = counts(m)
    p = c["total"]
    unit = max(c["layer"], c["embedding"])  # largest FSDP2 unit: a decoder layer or the (untied) embedding
    a = lora_params(m, LORA_RANKS[0])
    out = {"full FT, 1 GPU, bf16 weights and AdamW (model.dtype=bfloat16)": (2 * p, 2 * p, 4 * p),
           # float32 weights, gradients, m and v; bf16 autocast in the learner
           "full FT, 1 GPU, mixed precision (model.dtype=float32)": (4 * p, 4 * p, 8 * p),
           # the full bf16 model that rolls out and scores + fp32 master shards + two gathered bf16 units;
           # fp32 grad shards + one unsharded fp32 unit gradient; fp32 m, v shards
           f"full FT, FSDP2 x {GPUS}, mixed (model.dtype=bfloat16)": (2 * p + 4 * p // GPUS + 2 * 2 * unit,
                                                                      4 * p // GPUS + 4 * unit, 8 * p // GPUS),
           # frozen bf16 base + fp32 adapter (peft), bf16 autocast
           f"LoRA r={LORA_RANKS[0]}, 1 GPU, mixed (model.dtype=bfloat16)": (2 * p + 4 * a, 4 * a, 8 * a)}
    return out


def one_step_off(m: Shape, weights: int, grads: int, adam: int, trained: int, share: float) -> dict[str, float]:
    """trainer.off_policy_steps=1 with the hf backend, one rank's GPU (GiB): the learner's
    process (the colocated hf plan without its rollout share, plus, with
    learner_scoring_share > 0, the scoring copy of the model in bf16 and its scoring phase
    after the update's), and the rollout process on the same GPU (a bf16 copy, its prefix
    cache, and the scoring phase where it scores). Host: two shared-memory slots of the
    trained weights (``trained`` bytes each)."""
    p = counts(m)["total"]
    learner_phase = activations(m, MICRO_TOKENS, True) + learner_mask(MICRO_TOKENS) + learner_logits(MICRO_TOKENS)
    scoring = jsd_chunk() + scoring_forward(m)
    learner = weights + grads + adam + (2 * p + max(learner_phase, scoring) if share > 0 else learner_phase)
    rollout = 2 * p + PREFIX_TOKENS * kv_bytes_per_token(m) + (scoring if share < 1 else 0)
    return {"learner": learner / GIB, "rollout": rollout / GIB, "gpu": (learner + rollout) / GIB, "host": 2 * trained / GIB}


def main() -> None:
    print(f"toolkit defaults: learner.micro_batch_tokens={MICRO_TOKENS}, hindsight.jsd_chunk_tokens={JSD_CHUNK}, "
          f"hindsight.score_batch_tokens={SCORE_TOKENS}, model.prefix_cache_tokens={PREFIX_TOKENS}, "
          f"chunked_logprobs chunk={LOGPROB_CHUNK}, JSD chunk_elements={JSD_ELEMENTS}, VLLMPolicy kv_cache_gb={VLLM_KV_GB}")
    print()
    print("| model | hidden | inter | layers | heads q/kv | tied | params (computed) | published | non-emb | LoRA r=16 | LoRA r=64 | KV/token | act/token/layer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in QWEN3:
        c = counts(m)
        print(f"| {m.name} | {m.hidden} | {m.intermediate} | {m.layers} | {m.heads}/{m.kv_heads} | {'yes' if m.tied else 'no'} "
              f"| {c['total']:,} | {m.published} | {c['non_embedding'] / 1e9:.2f}B | {lora_params(m, 16):,} | {lora_params(m, 64):,} "
              f"| {kv_bytes_per_token(m) // 1024} KiB | {act_layer_bytes_per_token(m):,} B |")
    cols = ["weights", "grads", "adam", "act", "act_ckpt", "logits", "jsd", "rollout", "total", "total_ckpt", "total_sleep"]
    heads = ["weights", "grads", "AdamW", "act", "act ckpt", "logits", "JSD", "vLLM", "total", "total ckpt",
             "ckpt + sleep"]
    for m in QWEN3:
        print()
        print(f"{m.name} (GiB per GPU, micro-batch {MICRO_TOKENS} tokens, vLLM backend)")
        print()
        print("| setup | " + " | ".join(heads) + " |")
        print("|---|" + "---|" * len(heads))
        for label, (w, g, a) in setups(m).items():
            parts = plan(m, w, g, a)
            print(f"| {label} | " + " | ".join(f"{parts[k]:.1f}" for k in cols) + " |")
    print()
    print("bf16 weights and AdamW with the hf backend (no vLLM copy; prefix cache at its default), total GiB:")
    print()
    print("| model | prefix cache | micro 4096 | micro 2048 | micro 1024 | micro 1024, model.prefix_cache_tokens=0 |")
    print("|---|---|---|---|---|---|")
    for m in QWEN3:
        w, g, a = next(iter(setups(m).values()))
        totals = [plan(m, w, g, a, t, "hf")["total"] for t in (4096, 2048, 1024)]
        no_prefix = plan(m, w, g, a, 1024, "hf")["total"] - PREFIX_TOKENS * kv_bytes_per_token(m) / GIB
        print(f"| {m.name} | {PREFIX_TOKENS * kv_bytes_per_token(m) / GIB:.1f} | " + " | ".join(f"{t:.1f}" for t in totals)
              + f" | {no_prefix:.1f} |")
    print()
    print("vLLM engine at the defaults of model.vllm (kv_cache_gb, max_model_len=None): KV needed for one sequence of "
          "max_position_embeddings tokens, and tokens the KV budget holds:")
    for m in QWEN3:
        need = m.max_positions * kv_bytes_per_token(m) / GIB
        print(f"  {m.name}: {need:.2f} GiB for {m.max_positions:,} tokens; {VLLM_KV_GB:g} GiB holds "
              f"{int(VLLM_KV_GB * GIB // kv_bytes_per_token(m)):,} tokens")
    print()
    print(f"One-step-off (trainer.off_policy_steps=1, model.backend=hf, micro-batch {MICRO_TOKENS} tokens, activation "
          "checkpointing): GiB on one rank's GPU, learner process + rollout process, and host GiB for the two "
          "weight slots; colocated hf for comparison:")
    print()
    print("| model | setup | colocated hf | one-step-off, share 0: learner + rollout = GPU | share 0.5 | host slots |")
    print("|---|---|---|---|---|---|")
    for m in QWEN3:
        p, a = counts(m)["total"], lora_params(m, LORA_RANKS[0])
        bf16, lora = list(setups(m).items())[0], list(setups(m).items())[3]
        for (label, (w, g, adam)), trained in ((bf16, 2 * p), (lora, 4 * a)):
            colocated = plan(m, w, g, adam, backend="hf")["total_ckpt"]
            zero, half = one_step_off(m, w, g, adam, trained, 0.0), one_step_off(m, w, g, adam, trained, 0.5)
            print(f"| {m.name} | {label.split(',')[0]} | {colocated:.1f} | {zero['learner']:.1f} + {zero['rollout']:.1f} = "
                  f"{zero['gpu']:.1f} | {half['learner']:.1f} + {half['rollout']:.1f} = {half['gpu']:.1f} | {zero['host']:.2f} |")
    print()
    print("scoring phase extra (JSD chunk + no-grad forward of score_batch_tokens): "
          + ", ".join(f"{m.name} {(jsd_chunk() + scoring_forward(m)) / GIB:.1f}" for m in QWEN3) + " GiB")


if __name__ == "__main__":
    main()
