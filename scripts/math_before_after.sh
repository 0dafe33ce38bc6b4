#!/usr/bin/env bash
# Math before and after RL: a supervised warm-up of MODEL on the env's worked solutions,
# STEPS steps of PROMPTS prompts with ALGO (hp-rlvr by default; GRPO plays group_size 8
# rollouts of each prompt), then the warm start and the trained model on the test split
# with SAMPLES samples a problem (Avg@k, Pass@k).
# Usage: scripts/math_before_after.sh OUT_DIR [ALGO]; resumable: finished stages are kept.
# Defaults: the tiny model's run (200 SFT steps at 2e-3, 16 steps of 16 prompts at 1e-4,
# Avg@8 on all 200 test problems). OVERRIDES: more dotted config overrides for the run.
# The pretrained model's (docs/results.md):
#   MODEL=smollm2-135m SFT_STEPS=60 SFT_BATCH=8 SFT_LR=5e-5 STEPS=10 PROMPTS=8 LR=2e-5 \
#   SAMPLES=1 MAX_NEW_TOKENS=160 OVERRIDES=hindsight.weight_norm=max scripts/math_before_after.sh runs/math-smol ALGO
set -euo pipefail
out=${1:?usage: scripts/math_before_after.sh OUT_DIR [ALGO]}
algo=${2:-hp-rlvr}
bin=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
model=${MODEL:-tiny} steps=${STEPS:-16} prompts=${PROMPTS:-16} lr=${LR:-1e-4}
samples=${SAMPLES:-8} max_new=${MAX_NEW_TOKENS:-96}
mkdir -p "$out"
[ -f "$out/warm/config.json" ] || "$bin/hp-agent" sft --env math --model "$model" --steps "${SFT_STEPS:-200}" \
  --batch-size "${SFT_BATCH:-16}" --lr "${SFT_LR:-2e-3}" --out "$out/warm"
eval_args=(--env math --split test --samples "$samples" --max-new-tokens "$max_new")
[ -f "$out/warm-eval.json" ] || "$bin/hp-agent" eval --model "$out/warm" "${eval_args[@]}" --output "$out/warm-eval.json"
if [ -f "$out/$algo/config.yaml" ]; then
  "$bin/hp-agent" train --resume "$out/$algo"
else
  "$bin/hp-agent" train --env math --model "$out/warm" --algo "$algo" --steps "$steps" trainer.prompts_per_step="$prompts" \
    rollout.max_new_tokens="$max_new" learner.lr="$lr" trainer.run_dir="$out" trainer.name="$algo" trainer.checkpoint_every=2 \
    ${OVERRIDES:-}
fi
[ -f "$out/$algo-eval.json" ] || "$bin/hp-agent" eval --model "$out/$algo" "${eval_args[@]}" --output "$out/$algo-eval.json"
