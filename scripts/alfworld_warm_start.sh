#!/usr/bin/env bash
# The ALFWorld warm-start measurements of docs/results.md, one stage per call, resumable
# (a finished stage is skipped; an interrupted SFT continues from OUT.partial).
#
#   scripts/alfworld_warm_start.sh demos-official   # expert demos, the 200 official train games
#   scripts/alfworld_warm_start.sh demos-alfred     # expert demos, train games rebuilt from ALFRED
#                                                   # (COUNT trials rebuilt, LIMIT games played)
#   scripts/alfworld_warm_start.sh demos-synth      # expert demos, synthesized train games
#                                                   # (COUNT built, the first LIMIT played: demos-synthLIMIT.jsonl)
#   scripts/alfworld_warm_start.sh sft NAME STEPS DATA[,DATA...] [sft flags]
#   scripts/alfworld_warm_start.sh eval NAME SPLIT [LIMIT]   # greedy, 50 steps (the standard protocol)
#   scripts/alfworld_warm_start.sh ship NAME        # NAME becomes the shipped --model tiny-alfworld-warm
#
# The shipped warm start (docs/results.md), from synthesized games only: 600 games built, the
# expert's play of the first 200, 600 SFT steps (40-50 minutes on 2 cores):
#   COUNT=600 LIMIT=200 WORKERS=2 scripts/alfworld_warm_start.sh demos-synth
#   scripts/alfworld_warm_start.sh sft sft-S200g600 600 runs/warm/demos-synth200.jsonl
#   scripts/alfworld_warm_start.sh ship sft-S200g600
#
# Everything goes to $ROOT (default runs/warm). One torch thread per process. MODEL
# (default tiny-alfworld: the tiny model whose tokenizer holds ALFRED's names as single
# tokens) tokenizes the demonstrations and is where `sft` starts. PROMPT (default
# verl-agent, the tiny warm start's) is ALFWorld's prompt mode of the demonstrations and
# the evaluation; with PROMPT=append (restricted decoding's) `eval` plays restricted.
#
# The smollm2-135m warm start (docs/results.md, issue 46), append mode, a full fine-tune in
# bfloat16 on float32 master weights (about 35 minutes on 2 cores: games 15 min, expert 1.5 min,
# SFT 60 x 8 episodes at about 21 s a step with two torch threads):
#   ROOT=runs/warm-smol MODEL=smollm2-135m PROMPT=append COUNT=600 LIMIT=400 scripts/alfworld_warm_start.sh demos-synth
#   ROOT=runs/warm-smol MODEL=smollm2-135m PROMPT=append BATCH=8 HP_AGENT_TORCH_THREADS=2 OMP_NUM_THREADS=2 \
#     scripts/alfworld_warm_start.sh sft smol-S400 60 runs/warm-smol/demos-synth400.jsonl --lr 2e-4 --dtype bfloat16 --save-every 20
# then RL from it: hp-agent compare --config scripts/compare_alfworld_smol.yaml
set -euo pipefail
root=${ROOT:-runs/warm}
bin=${BIN:-.venv/bin}
model=${MODEL:-tiny-alfworld}
prompt=${PROMPT:-verl-agent}
restricted=$([ "$prompt" = append ] && echo --constrain-to-admissible || true)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$root"
stage=${1:?stage: demos-official, demos-alfred, demos-synth, sft, eval, ship}
shift
case "$stage" in
  demos-official)
    [ -f "$root/demos-official.jsonl" ] || "$bin/hp-agent" data alfworld --demos "$root/demos-official.jsonl" --source official --model "$model" --workers "${WORKERS:-1}" --prompt-mode "$prompt" ;;
  demos-alfred)
    # ALFRED's train trials rebuilt as games (about 60% kept), then the expert's won episodes.
    "$bin/hp-agent" data alfworld --from-alfred "${ALFRED:-../shared/data/alfred_json_2.1.0_trimmed.tar.gz}" --split train \
      --count "${COUNT:-1500}" --workers "${WORKERS:-1}"
    [ -f "$root/demos-alfred.jsonl" ] || "$bin/hp-agent" data alfworld --demos "$root/demos-alfred.jsonl" --source alfred --model "$model" \
      --workers "${WORKERS:-1}" ${LIMIT:+--limit "$LIMIT"} --prompt-mode "$prompt" ;;
  demos-synth)
    "$bin/hp-agent" data alfworld --build --split train --count "${COUNT:-600}" --workers "${WORKERS:-1}"
    out="$root/demos-synth${LIMIT:-}.jsonl"
    [ -f "$out" ] || "$bin/hp-agent" data alfworld --demos "$out" --source synth --model "$model" --workers "${WORKERS:-1}" \
      ${LIMIT:+--limit "$LIMIT"} --prompt-mode "$prompt" ;;
  sft)
    name=${1:?sft NAME STEPS DATA[,DATA...] [flags]}; steps=${2:?steps}; data=${3:?data files}; shift 3
    if [ ! -f "$root/$name/config.json" ]; then
      merged="$root/$name.data.jsonl"
      # shellcheck disable=SC2046
      cat $(echo "$data" | tr ',' ' ') > "$merged"
      "$bin/hp-agent" sft --data "$merged" --model "$model" --steps "$steps" --batch-size "${BATCH:-16}" --out "$root/$name" "$@"
      rm -f "$merged"
    fi ;;
  eval)
    name=${1:?eval NAME SPLIT [LIMIT]}; split=${2:?split}; limit=${3:-}
    out="$root/$name/eval-$split${limit:+-$limit}.json"
    [ -f "$out" ] || "$bin/hp-agent" eval --model "$root/$name" --split "$split" --source official --greedy \
      --max-new-tokens 24 ${limit:+--limit "$limit"} --prompt-mode "$prompt" $restricted --workers "${WORKERS:-1}" --output "$out"
    cat "$out" ;;
  ship)
    name=${1:?ship NAME}; shipped=hp_agent/policies/warm_starts/tiny-alfworld-warm
    [ -f "$root/$name/config.json" ] || { echo "no finished model in $root/$name" >&2; exit 2; }
    rm -rf "$shipped" && mkdir -p "$(dirname "$shipped")" && cp -r "$root/$name" "$shipped"
    rm -f "$shipped"/eval-*.json ;;  # evaluations kept beside the model are not part of it
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
