#!/usr/bin/env bash
# Does smollm2-135m read the fetch env's lists? Zero-shot (restricted to admissible actions), then after a
# 20-step SFT on the expert's demonstrations (restricted and free), on the first 36 test tasks; the tiny model's
# restricted score on all 144 beside it; then 50, 100, 150 and 200 SFT steps. About 45 minutes on one thread (the first use converts the model, ~30 s).
set -euo pipefail
B=${BIN:-.venv/bin}
out=${1:-runs/fetch-smol}
mkdir -p "$out"
eval_args=(--env fetch --limit 36 --max-new-tokens 8)
$B/hp-agent eval --model smollm2-135m "${eval_args[@]}" --constrain-to-admissible --output "$out/zero-shot-restricted.json"
$B/hp-agent eval --model tiny --env fetch --limit 144 --max-new-tokens 8 --constrain-to-admissible --output "$out/tiny-restricted.json"
[ -f "$out/sft20/config.json" ] || $B/hp-agent sft --env fetch --model smollm2-135m --steps 20 --batch-size 4 --lr 1e-4 --out "$out/sft20"
$B/hp-agent eval --model "$out/sft20" "${eval_args[@]}" --constrain-to-admissible --output "$out/sft20-restricted.json"
$B/hp-agent eval --model "$out/sft20" "${eval_args[@]}" --output "$out/sft20-free.json"
for n in 50 100 150 200; do
  [ -f "$out/sft$n/config.json" ] || $B/hp-agent sft --env fetch --model smollm2-135m --steps $n --batch-size 4 --lr 1e-4 --out "$out/sft$n"
  $B/hp-agent eval --model "$out/sft$n" "${eval_args[@]}" --constrain-to-admissible --output "$out/sft$n-restricted.json"
done
