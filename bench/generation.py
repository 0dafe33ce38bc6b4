"""Rollout generation throughput: our transformers sampler against ``model.generate`` and vLLM, on this CPU.

    .venv-vllm/bin/python bench/generation.py                      # the embedded tiny model
    .venv-vllm/bin/python bench/generation.py --random-model 1024x8   # random Qwen3, hidden 1024, 8 layers
    .venv/bin/python bench/generation.py --backends hf,generate    # without vLLM

Backends: ``hf`` is HFPolicy as shipped (its own sampling loop, prefix reuse, decode
attention without per-head key copies, preallocated cache); ``generate`` is transformers'
``model.generate`` on the same weights as a user would load them (``sdpa`` attention,
``DynamicCache``), with the same sampling (``do_sample``, temperature, ``top_p``, no
``top_k``) and no scores asked for, as TRL calls it; ``hf-no-reuse`` is ``hf`` with
``prefix_cache_tokens=0``, every prompt run whole as ``generate`` runs it; ``vllm`` is
VLLMPolicy.

The workload is a chat-history ALFWorld rollout (``prompt_mode="chat"``): ``--episodes``
episodes, ``--group-size`` of them per task (a GRPO/HP-RLVR group), ``--turns`` turns.
Turn 1's prompt is verl-agent's first-turn template with a room of ~10 receptacles and
its admissible actions; each later turn appends the assistant's action and the next
observation with its admissible actions, so every prompt extends the episode's previous
one and a group's first prompts are identical, as in training. Actions in the history
are fixed text chosen by a seeded RNG, not the sampled answers, so that both backends
process exactly the same prompts. Each turn samples ``--new-tokens`` tokens per episode
(temperature 1, the training default) through ``Policy.generate``, the call that
rollout makes.

The backends are measured in the same process, in turns (``--repeats`` times each, a
new set of episodes per repeat), after an untimed warm-up. vLLM's prefix cache is
emptied before each repeat, as is the transformers backend's (its ``prefix_cache``), so
both only reuse prefixes within a rollout (``generate`` reuses none). Throughput is
sampled tokens per second of ``generate`` wall time; ratios are of the medians.
All use ``--threads`` threads. The weight sync (``VLLMPolicy.sync_weights``) is timed
too, since the vLLM backend pays it once per learner step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

RECEPTACLES = ("cabinet", "countertop", "drawer", "shelf", "sinkbasin", "stoveburner", "fridge", "microwave",
               "coffeemachine", "toaster", "garbagecan", "diningtable", "sidetable", "armchair", "sofa", "dresser")
OBJECTS = ("apple", "mug", "knife", "egg", "potato", "tomato", "bread", "lettuce", "cup", "plate", "spoon", "pan")
TASKS = ("put a clean apple in fridge", "heat some egg and put it in countertop", "put two mug in cabinet",
         "cool some potato and put it in diningtable", "examine the cup with the desklamp")


def _room(rng: random.Random) -> list[str]:
    """~10 receptacles, e.g. ``["cabinet 1", "cabinet 2", ..., "toaster 1"]``."""
    return [f"{kind} {i}" for kind in rng.sample(RECEPTACLES, 7) for i in range(1, rng.choice((1, 1, 2)) + 1)]


def _admissible(places: list[str], here: str, rng: random.Random) -> str:
    actions = [f"go to {p}" for p in places if p != here] + ["inventory", "look"]
    actions += [f"take {o} {rng.randint(1, 3)} from {here}" for o in rng.sample(OBJECTS, 2)]
    return "\n ".join(f"'{a}'" for a in actions)


def rollout_prompts(policy, episodes: int, group_size: int, turns: int, seed: int) -> list[list[list[int]]]:
    """Prompt ids per turn per episode: ``[turn][episode] -> ids``; a group shares turn 1."""
    from hp_agent.envs.alfworld.env import CHAT_TURN_TEMPLATE, TEMPLATE_NO_HISTORY

    conversations = []
    for episode in range(episodes):
        task_rng = random.Random(seed * 1_000_003 + episode // group_size)
        rng = random.Random(seed * 1_000_003 + 7919 * episode + 1)
        places = _room(task_rng)
        intro = (f"-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
                 f"you see {', '.join('a ' + p for p in places)}.\n\nYour task is to: {task_rng.choice(TASKS)}.")
        messages = [{"role": "user", "content": TEMPLATE_NO_HISTORY.format(
            current_observation=intro, admissible_actions=_admissible(places, "", task_rng))}]
        per_turn = [list(messages)]
        for _ in range(turns - 1):
            here = rng.choice(places)
            seen = ", ".join(f"a {o} {rng.randint(1, 3)}" for o in rng.sample(OBJECTS, 3))
            messages += [
                {"role": "assistant", "content": f"<think>I should look for it at the {here}.</think><action>go to {here}</action>"},
                {"role": "user", "content": CHAT_TURN_TEMPLATE.format(
                    current_observation=f"You arrive at {here}. On the {here}, you see {seen}.",
                    admissible_actions=_admissible(places, here, rng))},
            ]
            per_turn.append(list(messages))
        conversations.append(per_turn)
    return [[policy.render(conversations[e][t]) for e in range(episodes)] for t in range(turns)]


def measure(policy, prompts_per_turn: list[list[list[int]]], sampling) -> dict[str, float]:
    """Play the turns through ``policy.generate``; sampled tokens and generate seconds."""
    tokens, seconds = 0, 0.0
    for prompts in prompts_per_turn:
        started = time.perf_counter()
        generations = policy.generate(prompts, sampling)
        seconds += time.perf_counter() - started
        tokens += sum(len(g.token_ids) for g in generations)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def random_model(spec: str, out_dir: Path) -> Path:
    """A random-init Qwen3 ``HIDDENxLAYERS`` (e.g. ``1024x8``) with the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from hp_agent.policies.tiny import tiny_config, tiny_model_path

    hidden, layers = (int(x) for x in spec.lower().split("x"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    head_dim = 64
    options = {key: value for key, value in tiny_config(tokenizer).to_dict().items() if key != "layer_types"}
    options.update(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers, max_window_layers=layers,
                   num_attention_heads=hidden // head_dim, num_key_value_heads=max(hidden // head_dim // 2, 1), head_dim=head_dim)
    config = Qwen3Config(**options)  # anew, so that the per-layer lists match the layer count
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, a model folder, or a cached hub id")
    parser.add_argument("--random-model", default=None, metavar="HIDDENxLAYERS",
                        help="instead of --model: a random-init Qwen3 of this size (e.g. 1024x8), tiny tokenizer")
    parser.add_argument("--episodes", type=int, default=16, help="episodes played at once (the batch)")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task; a group shares its first prompt")
    parser.add_argument("--turns", type=int, default=3, help="turns per episode")
    parser.add_argument("--new-tokens", type=int, default=24, help="max new tokens per turn")
    parser.add_argument("--repeats", type=int, default=3, help="rollouts per backend, measured in turns")
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads for both backends")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default="hf,hf-no-reuse,generate,vllm",
                        help="comma-separated: hf, hf-no-reuse, generate, vllm (hf first)")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    if backends[0] != "hf" or not set(backends) <= {"hf", "hf-no-reuse", "generate", "vllm"}:
        parser.error(f"--backends: 'hf' first, then any of 'hf-no-reuse', 'generate', 'vllm'; got {args.backends!r}")

    # Before torch loads: the vLLM engine freezes the thread count once it starts.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from generate_baseline import GeneratePolicy
    from hp_agent.policies import SamplingParams
    from hp_agent.policies.hf import DEFAULT_PREFIX_CACHE_TOKENS, HFPolicy
    from hp_agent.policies.resolve import resolve_model

    def load(backend: str, path: Path):
        if backend == "vllm":
            from hp_agent.policies.vllm import VLLMPolicy

            return VLLMPolicy(path, max_model_len=args.max_model_len)
        if backend == "generate":
            return GeneratePolicy(path)
        return HFPolicy(path, prefix_cache_tokens=0 if backend == "hf-no-reuse" else DEFAULT_PREFIX_CACHE_TOKENS)

    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        path = random_model(args.random_model, Path(tmp)) if args.random_model else resolve_model(args.model)
        policies = {backend: load(backend, path) for backend in backends}
        sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
        warmup = rollout_prompts(policies["hf"], 2, 1, 1, seed=-1)
        for policy in policies.values():
            measure(policy, warmup, sampling)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in policies}
        prompt_lengths: list[int] = []
        for repeat in range(args.repeats):
            prompts = rollout_prompts(policies["hf"], args.episodes, args.group_size, args.turns, seed=args.seed + repeat)
            prompt_lengths += [len(p) for turn in prompts for p in turn]
            for name, policy in policies.items():
                if name == "vllm":
                    policy.llm.reset_prefix_cache()
                else:
                    policy.prefix_cache.clear()
                rows[name].append(measure(policy, prompts, sampling))
        sync_seconds = [policies["vllm"].sync_weights() for _ in range(3)] if "vllm" in policies else []
        parameters = sum(p.numel() for p in policies["hf"].model.parameters())

    median = {name: statistics.median(r["tokens_per_s"] for r in runs) for name, runs in rows.items()}
    ratios = {}
    if "generate" in median:
        ratios["hf_over_generate"] = median["hf"] / median["generate"]
        if "hf-no-reuse" in median:
            ratios["hf_no_reuse_over_generate"] = median["hf-no-reuse"] / median["generate"]
    if "vllm" in median:
        ratios["vllm_over_hf"] = median["vllm"] / median["hf"]
    label = f"random Qwen3 {args.random_model}" if args.random_model else str(args.model)
    print(f"model {label} ({parameters / 1e6:.1f}M params)  threads {args.threads}  episodes {args.episodes} "
          f"(groups of {args.group_size})  turns {args.turns}  new tokens {args.new_tokens}  "
          f"prompt tokens mean {statistics.mean(prompt_lengths):.0f} (min {min(prompt_lengths)}, max {max(prompt_lengths)})")
    print(f"{'backend':>11} {'tokens/s (median)':>18}  per repeat")
    for name, runs in rows.items():
        print(f"{name:>11} {median[name]:>18.1f}  " + "  ".join(f"{r['tokens_per_s']:.1f}" for r in runs))
    if "hf_over_generate" in ratios:
        no_reuse = ratios.get("hf_no_reuse_over_generate")
        print(f"ratio hf / model.generate: {ratios['hf_over_generate']:.2f}x"
              + (f"   without prefix reuse: {no_reuse:.2f}x" if no_reuse else ""))
    if "vllm_over_hf" in ratios:
        print(f"ratio vllm / hf: {ratios['vllm_over_hf']:.2f}x   weight sync: {statistics.median(sync_seconds) * 1000:.1f} ms")
    sync = round(statistics.median(sync_seconds), 4) if sync_seconds else None
    print(json.dumps({"model": label, "params_m": round(parameters / 1e6, 2), "threads": args.threads,
                      "episodes": args.episodes, "turns": args.turns, "new_tokens": args.new_tokens,
                      "prompt_tokens_mean": round(statistics.mean(prompt_lengths), 1),
                      **{f"{name}_tokens_per_s": round(value, 1) for name, value in median.items()},
                      **{name: round(value, 3) for name, value in ratios.items()},
                      "sync_s": sync}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
