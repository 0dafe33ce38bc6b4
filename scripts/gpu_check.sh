#!/usr/bin/env bash
# On a CUDA machine: one HP-RLVR step and one GRPO step of a randomly initialised Qwen3 of
# the 8B configuration (scripts/random_qwen3.py), bf16 base with a LoRA adapter (r=16) in
# fp32, bf16 autocast, activation checkpointing, rolled out by vLLM on the GPU (the hf
# backend where vllm is missing, said on screen). Then the same HP-RLVR run one-step-off
# (hf backend: trainer.off_policy_steps=1, the learner scoring half of each batch), 3 steps.
# Prints peak GPU memory and phase times per step, for docs/scale.md.
#
# The environment: .venv-gpu, made once with the machine's own packages visible
# (--system-site-packages: a CUDA torch and vllm already installed are used as they are)
# and hp_agent installed into it; dependencies missing there come from the package
# registry, where one is reachable.
#
# Usage: bash scripts/gpu_check.sh [SIZE]      SIZE: 8B (default), 4B or 1.7B
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:-8B}"
OUT="${OUT:-/tmp/hp-agent-gpu-check}"
VENV=.venv-gpu
PY="$VENV/bin/python"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" TOKENIZERS_PARALLELISM=false

if [[ ! -x "$PY" ]]; then
    python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install --quiet -e . || { echo "gpu_check: could not install hp_agent's dependencies"; exit 1; }
fi
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "gpu_check needs a CUDA GPU (torch.cuda.is_available() is False)"
props = torch.cuda.get_device_properties(0)
print(f"gpu_check: {props.name}, {props.total_memory / 2**30:.1f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
if "$PY" -c "import vllm" 2>/dev/null; then BACKEND=vllm; else BACKEND=hf; echo "gpu_check: no vllm here; the hf backend rolls out"; fi

MODEL="$OUT/qwen3-$SIZE-random"
[[ -f "$MODEL/config.json" ]] || "$PY" scripts/random_qwen3.py --size "$SIZE" --out "$MODEL"
rm -rf "$OUT/runs"
COMMON=(--env keys --model "$MODEL" --lora-rank 16 trainer.run_dir="$OUT/runs" trainer.save_trajectories=false
        trainer.prompts_per_step=8 model.device=cuda model.dtype=bfloat16 learner.mixed_precision=true
        learner.activation_checkpointing=true rollout.max_new_tokens=64)
VLLM=(--backend "$BACKEND" model.vllm.max_model_len=4096 model.vllm.kv_cache_gb=8 model.vllm.sleep=true)
OFF=(--backend hf --steps 3 trainer.off_policy_steps=1 trainer.learner_scoring_share=0.5)
for RUN in hp-rlvr grpo hp-rlvr-off; do
    started=$(date +%s)
    if [[ "$RUN" == hp-rlvr-off ]]; then FLAGS=(--algo hp-rlvr "${OFF[@]}"); else FLAGS=(--algo "$RUN" --steps 1 "${VLLM[@]}"); fi
    "$PY" -m hp_agent train "${COMMON[@]}" "${FLAGS[@]}" --name "$RUN" > "$OUT/$RUN.log" 2>&1 || { tail -40 "$OUT/$RUN.log"; exit 1; }
    echo "gpu_check: $RUN done in $(( $(date +%s) - started )) s (start-up included)"
done
"$PY" - "$OUT/runs" "$BACKEND" "$SIZE" <<'PY'
import json, sys
from pathlib import Path
runs, backend, size = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"Qwen3-{size} (random init), LoRA r=16, bf16 autocast, activation checkpointing, backend {backend} (hp-rlvr-off: hf, one-step-off, learner scoring half), 8 prompts")
for algo in ("hp-rlvr", "grpo", "hp-rlvr-off"):
    metrics = [json.loads(line) for line in (runs / algo / "metrics.jsonl").read_text().splitlines()][-1]
    phases = {k.removeprefix("time/"): round(v, 2) for k, v in metrics.items() if k.startswith("time/")}
    peak, used = metrics.get("gpu/peak_memory_gib", float("nan")), metrics.get("gpu/device_used_gib", float("nan"))
    print(f"{algo}: peak {peak:.1f} GiB through torch's allocator, {used:.1f} GiB in use on the device at the end; seconds {phases}")
PY
