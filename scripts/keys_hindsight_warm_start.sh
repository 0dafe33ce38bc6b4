#!/usr/bin/env bash
# issue 25 item 3: JSD weights on keys with and without the hindsight-aware warm start
set -euo pipefail
B=.venv/bin
K='{demo_mistakes: 0.5}'
[ -d runs/h3/keys-D ] || $B/hp-agent sft --env keys --env-kwargs "$K" --model tiny --steps 200 --lr 1e-3 --out runs/h3/keys-D
[ -d runs/h3/keys-D2 ] || $B/hp-agent sft --env keys --env-kwargs "$K" --model runs/h3/keys-D --steps 100 --lr 1e-3 --out runs/h3/keys-D2
[ -d runs/h3/keys-H ] || $B/hp-agent sft --env keys --env-kwargs "$K" --model runs/h3/keys-D --steps 100 --lr 1e-3 --hindsight \
    --hindsight-episodes 64 --hindsight-max-new-tokens 5 --out runs/h3/keys-H
$B/python scripts/jsd_shares.py --env keys --model runs/h3/keys-D --model runs/h3/keys-D2 --model runs/h3/keys-H --games 64 \
    --max-new-tokens 5 --out runs/h3/keys-shares.json
for m in keys-D2 keys-H; do
  $B/hp-agent eval --model runs/h3/$m --env keys --split test --temperature 1 --max-new-tokens 5 --seed 1 --output runs/h3/$m/eval.json
done
