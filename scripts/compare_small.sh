#!/usr/bin/env bash
# The CPU-scale HP-RLVR vs GRPO comparisons of docs/results.md on math and code, from a
# supervised warm start of the embedded tiny model. Resumable: rerun the same command.
# Usage: scripts/compare_small.sh math|code [ROOT (default runs/cmp)]
set -euo pipefail
env=${1:?usage: scripts/compare_small.sh math|code [ROOT]}
root=${2:-runs/cmp}
bin=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
case "$env" in
  math) warm_steps=200; tokens=96; limit=100 ;;
  code) warm_steps=300; tokens=160; limit=40 ;;
  *) echo "unknown env $env (math or code)" >&2; exit 2 ;;
esac
mkdir -p "$root"
[ -f "$root/warm-$env/config.json" ] || "$bin/hp-agent" sft --env "$env" --model tiny --steps "$warm_steps" --out "$root/warm-$env"
# Both methods: 8 prompts a step (HP-RLVR 8 rollouts, GRPO 64), lr 1e-4, 32 steps.
"$bin/hp-agent" compare --env "$env" --steps 32 --out "$root/$env" --eval-limit "$limit" \
  model.name="$root/warm-$env" trainer.prompts_per_step=8 rollout.max_new_tokens="$tokens" learner.lr=1e-4
