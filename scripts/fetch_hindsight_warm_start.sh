#!/usr/bin/env bash
# issue 25 item 3 on a pretrained model: smollm2-135m's JSD weights on fetch with and without
# the hindsight-aware warm start (D: demonstrations; D2: D and as many more demonstration steps;
# H: D and as many steps whose batches also hold privileged-block copies of its own played episodes).
# About 15 minutes on one thread. Usage: scripts/fetch_hindsight_warm_start.sh [OUT]
set -euo pipefail
B=.venv/bin
O=${1:-runs/fetch-h}
K='{demo_mistakes: 0.5}'
S="--model smollm2-135m --batch-size 4 --lr 1e-4"
[ -d $O/D ] || $B/hp-agent sft --env fetch --env-kwargs "$K" $S --steps 40 --out $O/D
S="--batch-size 4 --lr 1e-4"
[ -d $O/D2 ] || $B/hp-agent sft --env fetch --env-kwargs "$K" --model $O/D $S --steps 30 --out $O/D2
[ -d $O/H ] || $B/hp-agent sft --env fetch --env-kwargs "$K" --model $O/D $S --steps 30 --hindsight \
    --hindsight-episodes 32 --hindsight-max-new-tokens 8 --out $O/H
$B/python scripts/jsd_shares.py --env fetch --model $O/D --model $O/D2 --model $O/H --games 48 --max-turns 3 \
    --max-new-tokens 8 --out $O/shares.json
