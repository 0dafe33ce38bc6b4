#!/usr/bin/env bash
# The math run from the first demo, again: a 200-step supervised warm-up of the tiny
# model, 16 steps of 16 prompts with ALGO (hp-rlvr by default), then the warm start and
# the trained model on the whole test split with 8 samples a problem (Avg@8, Pass@8).
# Usage: scripts/math_before_after.sh OUT_DIR [ALGO]; resumable: finished stages are kept.
set -euo pipefail
out=${1:?usage: scripts/math_before_after.sh OUT_DIR [ALGO]}
algo=${2:-hp-rlvr}
bin=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$out"
[ -f "$out/warm/config.json" ] || "$bin/hp-agent" sft --env math --model tiny --steps 200 --out "$out/warm"
eval_args=(--env math --split test --samples 8 --max-new-tokens 96)
[ -f "$out/warm-eval.json" ] || "$bin/hp-agent" eval --model "$out/warm" "${eval_args[@]}" --output "$out/warm-eval.json"
if [ -f "$out/$algo/config.yaml" ]; then
  "$bin/hp-agent" train --resume "$out/$algo"
else
  "$bin/hp-agent" train --env math --model "$out/warm" --algo "$algo" --steps 16 trainer.prompts_per_step=16 \
    rollout.max_new_tokens=96 learner.lr=1e-4 trainer.run_dir="$out" trainer.name="$algo"
fi
[ -f "$out/$algo-eval.json" ] || "$bin/hp-agent" eval --model "$out/$algo" "${eval_args[@]}" --output "$out/$algo-eval.json"
