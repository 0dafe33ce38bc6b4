#!/usr/bin/env bash
# The first thing to run on a GPU machine (README, "On a GPU"). On a randomly initialised
# Qwen3 of a published shape (scripts/random_qwen3.py; no hub download), it checks:
#   1. the device and the dtypes `auto` resolves to there;
#   2. sampling on each backend (hf, and vllm where it imports): restricted episodes of the
#      box-and-key game, tokens/s, peak memory, and the mean per-token |delta log-prob|
#      between the sampler's recorded log-probs and the learner's for the same tokens
#      (scripts/gpu_check.py);
#   3. one HP-RLVR and one GRPO training step on each backend (LoRA r=16 on the bf16 base,
#      bf16 autocast, activation checkpointing; vLLM asleep between rollouts);
#   4. three HP-RLVR steps one-step-off (trainer.off_policy_steps=1, the learner scoring
#      half of each batch) on each backend.
# Each check's log is in $OUT; a failed check is reported and the others still run. The
# last line sums it up in one line to paste into a bug report; the exit status is
# non-zero when anything failed.
#
# The environment: .venv-gpu, made once with the machine's own packages visible
# (--system-site-packages: a CUDA torch and vllm already installed are used as they are)
# and hp_agent installed into it; dependencies missing there come from the package registry.
#
# Usage: bash scripts/gpu_check.sh [SIZE]      SIZE: 8B (default), 4B or 1.7B
set -uo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:-8B}"
OUT="${OUT:-/tmp/hp-agent-gpu-check}"
VENV=.venv-gpu
PY="$VENV/bin/python"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"

if [[ ! -x "$PY" ]]; then
    python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install --quiet -e . || { echo "gpu_check: could not install hp_agent's dependencies"; exit 1; }
fi
MACHINE=$("$PY" - <<'PY'
import platform, torch
from hp_agent.devices import available_devices, resolve_device, resolve_dtype
device = resolve_device("auto")
try:
    import vllm
    engine = f"vllm {vllm.__version__}"
except ImportError:
    engine = "no vllm"
print(f"torch {torch.__version__} CUDA {torch.version.cuda}; {available_devices()}; auto: {device}/{resolve_dtype('auto', device)}; "
      f"bf16 supported: {torch.cuda.is_available() and torch.cuda.is_bf16_supported()}; {engine}; python {platform.python_version()}")
PY
) || { echo "gpu_check: torch does not import in $VENV"; exit 1; }
echo "gpu_check: $MACHINE"
[[ "$MACHINE" == *"auto: cuda"* ]] || { echo "gpu_check: needs a CUDA GPU (auto resolves to the CPU here)"; exit 1; }
BACKENDS=hf
"$PY" -c "import vllm" 2>/dev/null && BACKENDS="hf vllm" || echo "gpu_check: no vllm here (pip install vllm); the hf backend only"

MODEL="$OUT/qwen3-$SIZE-random"
[[ -f "$MODEL/config.json" ]] || "$PY" scripts/random_qwen3.py --size "$SIZE" --out "$MODEL" || exit 1
rm -rf "$OUT/runs"
FAILED=()
RESULTS=()

"$PY" scripts/gpu_check.py --model "$MODEL" --backends "${BACKENDS// /,}" > "$OUT/sampling.log" 2>&1
status=$?
grep '^gpu_check-sampling' "$OUT/sampling.log"
[[ $status -eq 0 ]] || { FAILED+=(sampling); tail -20 "$OUT/sampling.log"; }
for backend in $BACKENDS; do
    dlogp=$(grep "^gpu_check-sampling $backend:" "$OUT/sampling.log" | sed -n 's/.*"mean_abs_dlogp": \([^,]*\).*/\1/p')
    RESULTS+=("dlogp[$backend]=${dlogp:-none}")
done

COMMON=(--env keys --model "$MODEL" --lora-rank 16 trainer.run_dir="$OUT/runs" trainer.save_trajectories=false
        trainer.prompts_per_step=8 learner.activation_checkpointing=true rollout.max_new_tokens=64
        rollout.constrain_to_admissible=true)
for backend in $BACKENDS; do
    ENGINE=()
    [[ $backend == vllm ]] && ENGINE=(model.vllm.sleep=true)
    for run in hp-rlvr grpo off-policy; do
        name="$run-$backend"
        if [[ $run == off-policy ]]; then
            FLAGS=(--algo hp-rlvr --steps 3 trainer.off_policy_steps=1 trainer.learner_scoring_share=0.5)
        else
            FLAGS=(--algo "$run" --steps 1 "${ENGINE[@]}")
        fi
        started=$(date +%s)
        if "$PY" -m hp_agent train "${COMMON[@]}" --backend "$backend" "${FLAGS[@]}" --name "$name" > "$OUT/$name.log" 2>&1; then
            line=$("$PY" - "$OUT/runs/$name/metrics.jsonl" <<'PY'
import json, sys
metrics = [json.loads(line) for line in open(sys.argv[1])][-1]
print(f"peak {metrics.get('gpu/peak_memory_gib', float('nan')):.1f} GiB (torch), {metrics.get('gpu/device_used_gib', float('nan')):.1f} GiB "
      f"on the device, step {metrics.get('time/total', float('nan')):.1f} s, grad norm {metrics.get('train/grad_norm', float('nan')):.3g}")
PY
)
            echo "gpu_check: $name ok in $(( $(date +%s) - started )) s (start-up included): $line"
            RESULTS+=("$name=ok")
        else
            echo "gpu_check: $name FAILED (log: $OUT/$name.log)"; tail -15 "$OUT/$name.log"
            FAILED+=("$name"); RESULTS+=("$name=FAILED")
        fi
    done
done
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ ${#FAILED[@]} -eq 0 ]]; then VERDICT=PASS; else VERDICT="FAIL(${FAILED[*]})"; fi
echo "gpu_check $VERDICT | hp_agent $REV | Qwen3-$SIZE random | $MACHINE | ${RESULTS[*]}"
[[ ${#FAILED[@]} -eq 0 ]]
