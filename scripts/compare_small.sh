#!/usr/bin/env bash
# The CPU-scale HP-RLVR vs GRPO comparisons of docs/results.md on math, code and the
# box-and-key game, from a supervised warm start of the embedded tiny model.
# Resumable: rerun the same command. Usage: scripts/compare_small.sh math|code|keys [ROOT]
set -euo pipefail
env=${1:?usage: scripts/compare_small.sh math|code|keys [ROOT]}
root=${2:-runs/cmp}
bin=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
warm=(--steps 200)
case "$env" in
  # Both methods: 8 prompts a step (HP-RLVR 8 rollouts, GRPO 64), lr 1e-4, 32 steps.
  math) steps=32; settings=(trainer.prompts_per_step=8 rollout.max_new_tokens=96); eval=(--eval-limit 100) ;;
  code) steps=32; warm=(--steps 300); settings=(trainer.prompts_per_step=8 rollout.max_new_tokens=160); eval=(--eval-limit 40) ;;
  # make demo's game and warm start: 16 prompts a step (HP-RLVR 16 episodes, GRPO 128), 24 steps.
  keys) steps=24; warm=(--steps 200 --lr 1e-3 --env-kwargs '{demo_mistakes: 0.5}')
        settings=(trainer.prompts_per_step=16 rollout.max_new_tokens=5 learner.mini_batch_prompts=8); eval=() ;;
  *) echo "unknown env $env (math, code or keys)" >&2; exit 2 ;;
esac
mkdir -p "$root"
[ -f "$root/warm-$env/config.json" ] || "$bin/hp-agent" sft --env "$env" --model tiny "${warm[@]}" --out "$root/warm-$env"
"$bin/hp-agent" compare --env "$env" --steps "$steps" --out "$root/$env" "${eval[@]}" \
  model.name="$root/warm-$env" learner.lr=1e-4 "${settings[@]}"
