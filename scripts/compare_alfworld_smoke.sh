#!/bin/bash
# A CPU-scale HP-RLVR vs GRPO comparison on ALFWorld from `make demo`'s warm start
# (24 expert games, 60 SFT steps): 8 steps each, 4 prompts per step, 12 steps per
# episode, evaluated on the first 12 ID and 12 OOD games (12 turns). Resumable: rerun
# the same command. Usage: scripts/compare_alfworld_smoke.sh WARM_START_FOLDER OUT
set -euo pipefail
warm=${1:?warm-start model folder (make demo writes runs/demo-<time>-sft)}
out=${2:-runs/cmp-alfworld-smoke}
exec .venv/bin/hp-agent compare --env alfworld --steps 8 --out "$out" \
  model.name="$warm" trainer.prompts_per_step=4 env.num_workers=2 rollout.max_new_tokens=24 \
  'env.kwargs={max_steps: 12}' --eval-limit 12 --eval-max-turns 12
