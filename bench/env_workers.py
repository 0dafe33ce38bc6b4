"""Env time of an EnvPool with 1 and 2 worker processes (no model): starts, steps, a GRPO step.

    .venv/bin/python bench/env_workers.py --env alfworld --env-kwargs '{"split": "id"}'
    .venv/bin/python bench/env_workers.py --env math --rounds 300

Three measurements per pool, each on games no earlier measurement of that pool played:

* starts: reset every slot on a new game, then reset the same games again (repeated);
  ``--start-rounds`` times. Reported per reset: the wall time of the ``reset_many`` call
  divided by the slots it reset (with 1 worker, one reset's latency).
* grpo: ``num_envs / --group`` prompts, ``--group`` copies each on adjacent slots (as the
  trainer plays them), reset, then stepped with random admissible actions until every
  episode ends (the env's ``max_turns``): the env time of one GRPO step's rollout.
* play: ``--rounds`` rounds of one ``step_many`` over every slot and one ``reset_many``
  for the slots whose episode ended: steps/s with resets included, the figure for the
  worker-count ratio.

Actions are random admissible actions put into ``--action-template`` when the info has
``admissible_actions`` (ALFWorld), else ``--action``; task and action streams are the
same for every pool, so each does the same work. For ALFWorld, every pool starts with
an empty cache of translated games (its own ``HP_AGENT_CACHE``), so "new" means never
translated, and the pools with ``speedups=False`` (TextWorld's engine as shipped) are
measured too. All pools are built first, then measured in turns (``--repeats`` times),
so that load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from itertools import cycle

from hp_agent.envs import list_envs
from hp_agent.envs.pool import EnvError, EnvPool, make_env_pool


class Meter:
    """Plays on one pool, timing its calls; ``tasks`` hands out games never played here."""

    def __init__(self, pool: EnvPool, tasks: list[str], template: str, action: str, seed: int):
        self.pool, self.template, self.action = pool, template, action
        self.tasks = iter(tasks)
        self.rng = random.Random(seed)
        self.totals: dict[str, float] = defaultdict(float)

    def reset(self, slots: list[int], tasks: list[str], label: str) -> dict[int, dict]:
        started = time.perf_counter()
        results = self.pool.reset_many([(slot, k, {"task_id": task}) for k, (slot, task) in enumerate(zip(slots, tasks))])
        self.totals[f"{label}_s"] += time.perf_counter() - started
        self.totals[f"{label}_n"] += len(slots)
        self.totals["errors"] += sum(isinstance(r, EnvError) for r in results)
        return {slot: ({} if isinstance(r, EnvError) else r[1]) for slot, r in zip(slots, results)}

    def step(self, infos: dict[int, dict], label: str) -> list[int]:
        """Step every slot of ``infos`` once; returns the slots whose episode ended."""
        slots = list(infos)
        actions = [self.template.format(self.rng.choice(infos[s]["admissible_actions"]))
                   if infos[s].get("admissible_actions") else self.action for s in slots]
        started = time.perf_counter()
        results = self.pool.step_many(list(zip(slots, actions)))
        self.totals[f"{label}_s"] += time.perf_counter() - started
        self.totals[f"{label}_n"] += len(slots)
        ended = []
        for slot, result in zip(slots, results):
            infos[slot]["steps"] = infos[slot].get("steps", 0) + 1
            if isinstance(result, EnvError):
                self.totals["errors"] += 1
                ended.append(slot)
                continue
            _, _, terminated, truncated, info = result
            if terminated or truncated or infos[slot]["steps"] >= self.pool.max_turns:
                ended.append(slot)
            else:
                infos[slot] = {**info, "steps": infos[slot]["steps"]}
        return ended

    def starts(self, rounds: int) -> None:
        slots = list(range(self.pool.num_envs))
        for _ in range(rounds):
            tasks = [next(self.tasks) for _ in slots]
            self.reset(slots, tasks, "reset_new")
            self.reset(slots, tasks, "reset_repeated")

    def grpo(self, group: int) -> None:
        prompts = max(1, self.pool.num_envs // group)
        tasks = [task for task in (next(self.tasks) for _ in range(prompts)) for _ in range(group)]
        slots = self.pool.balanced_slots(len(tasks))
        started = time.perf_counter()
        infos = self.reset(slots, tasks, "grpo_reset")
        while infos:
            for slot in self.step(infos, "grpo_step"):
                del infos[slot]
        self.totals["grpo_env_s"] += time.perf_counter() - started
        self.totals["grpo_prompts"] += prompts

    def play(self, rounds: int) -> None:
        slots = list(range(self.pool.num_envs))
        infos = self.reset(slots, [next(self.tasks) for _ in slots], "play_reset")
        for _ in range(rounds):
            ended = self.step(infos, "play_step")
            if ended:
                infos.update(self.reset(ended, [next(self.tasks) for _ in ended], "play_reset"))


def build_pools(env: str, kwargs: dict, num_envs: int, workers: list[int], shipped: bool,
                caches: list[str]) -> dict[str, EnvPool]:
    """One pool per worker count (and per engine, for ALFWorld), each with its own cache
    folder (appended to ``caches``)."""
    variants = [(w, True) for w in workers] + ([(w, False) for w in workers] if shipped else [])
    pools: dict[str, EnvPool] = {}
    saved = os.environ.get("HP_AGENT_CACHE")
    try:
        for w, speedups in variants:
            env_kwargs = dict(kwargs)
            if env == "alfworld":
                from hp_agent.envs.alfworld.sources import resolve_data_root

                env_kwargs.setdefault("data_root", str(resolve_data_root(kwargs.get("split", "train"), "auto", None, None)))
                env_kwargs["speedups"] = speedups
                caches.append(tempfile.mkdtemp(prefix="hp_agent_bench_cache_"))
                os.environ["HP_AGENT_CACHE"] = caches[-1]  # workers copy the environment at start
            pools[f"{w}w" + ("" if speedups else " shipped")] = make_env_pool(env, num_envs, num_workers=w, env_kwargs=env_kwargs)
    except BaseException:
        for pool in pools.values():
            pool.close()
        raise
    finally:
        if saved is None:
            os.environ.pop("HP_AGENT_CACHE", None)
        else:
            os.environ["HP_AGENT_CACHE"] = saved
    return pools


def rate(totals: dict[str, float], label: str) -> float:
    """Milliseconds of call wall time per env (reset or step) for ``label``."""
    return 1000 * totals[f"{label}_s"] / max(1.0, totals[f"{label}_n"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default=None, help="registered env name or module:factory (default: alfworld if available, else math)")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of keyword arguments for the env")
    parser.add_argument("--num-envs", type=int, default=8, help="env slots in the pool")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to compare")
    parser.add_argument("--start-rounds", type=int, default=1, help="rounds of new-then-repeated resets of every slot")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size (copies of each prompt)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds (one step of every slot) of the play measurement")
    parser.add_argument("--repeats", type=int, default=2, help="measure the pools in turns, this many times")
    parser.add_argument("--no-shipped", action="store_true", help="ALFWorld: skip the pools running the engine as shipped")
    parser.add_argument("--action", default="The answer is \\boxed{0}.", help="action text when the env lists no admissible actions")
    parser.add_argument("--action-template", default="<action>{}</action>",
                        help="format of a chosen admissible action (default: the ALFWorld env's tags)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    kwargs = json.loads(args.env_kwargs)
    workers = [int(w) for w in args.workers.split(",")]
    candidates = [args.env] if args.env else [name for name in ("alfworld", "math") if name in list_envs()]
    caches: list[str] = []
    for env in candidates:
        try:
            pools = build_pools(env, kwargs, args.num_envs, workers, env == "alfworld" and not args.no_shipped, caches)
            break
        except RuntimeError as error:
            if args.env:
                raise
            print(f"[{env} not usable, trying the next default: {str(error).splitlines()[0]}]", file=sys.stderr)
    else:
        raise SystemExit("no env could be built")

    task_ids = next(iter(pools.values())).task_ids()
    shuffled = random.Random(args.seed).sample(task_ids, len(task_ids))
    per_repeat = args.num_envs * args.start_rounds + max(1, args.num_envs // args.group)
    meters = {name: Meter(pool, [], args.action_template, args.action, args.seed) for name, pool in pools.items()}
    try:
        for repeat in range(args.repeats):
            fresh = shuffled[repeat * per_repeat:(repeat + 1) * per_repeat]
            if len(fresh) < per_repeat:
                raise SystemExit(f"{env} lists {len(task_ids)} games: too few for {args.repeats} repeats of new games")
            for name, meter in meters.items():
                meter.tasks = iter(fresh)
                meter.rng = random.Random(args.seed + repeat)
                meter.starts(args.start_rounds)
                meter.grpo(args.group)
                meter.tasks = cycle(shuffled[per_repeat * args.repeats:] + shuffled)  # play: games recur
                meter.play(args.rounds)
    finally:
        for pool in pools.values():
            pool.close()
        for folder in caches:
            shutil.rmtree(folder, ignore_errors=True)

    print(f"env {env}  kwargs {json.dumps(kwargs)}  slots {args.num_envs}  {args.repeats} repeats; "
          "ms = call wall time per env; grpo s = one step's env time for the prompts of one wave")
    print(f"{'pool':>12} {'new reset ms':>12} {'repeat ms':>10} {'play reset ms':>13} {'step ms':>8} "
          f"{'steps/s':>8} {'grpo s':>7} {'errors':>6}")
    summary: dict[str, float | str] = {"env": env, "num_envs": args.num_envs}
    for name, meter in meters.items():
        t = meter.totals
        steps_per_s = t["play_step_n"] / (t["play_step_s"] + t["play_reset_s"])
        grpo_s = t["grpo_env_s"] / args.repeats
        print(f"{name:>12} {rate(t, 'reset_new'):>12.1f} {rate(t, 'reset_repeated'):>10.1f} {rate(t, 'play_reset'):>13.1f} "
              f"{rate(t, 'play_step'):>8.1f} {steps_per_s:>8.1f} {grpo_s:>7.2f} {int(t['errors']):>6}")
        summary[f"steps_per_s_{name}"] = round(steps_per_s, 2)
        summary[f"grpo_s_{name}"] = round(grpo_s, 3)
    first = meters[f"{workers[0]}w"].totals
    summary["repeat_reset_speedup"] = round(rate(first, "reset_new") / rate(first, "reset_repeated"), 2)
    print(f"repeated vs new game reset, {workers[0]} worker(s): {summary['repeat_reset_speedup']}x faster")
    if len(workers) >= 2:
        last = meters[f"{workers[-1]}w"].totals
        ratio = (last["play_step_n"] / (last["play_step_s"] + last["play_reset_s"])) / (
            first["play_step_n"] / (first["play_step_s"] + first["play_reset_s"]))
        summary["workers_ratio"] = round(ratio, 3)
        print(f"play steps/s, {workers[-1]} vs {workers[0]} workers: {ratio:.2f}x")
    for w in workers:
        if f"{w}w shipped" in meters:
            speedup = meters[f"{w}w shipped"].totals["grpo_env_s"] / meters[f"{w}w"].totals["grpo_env_s"]
            summary[f"grpo_speedup_{w}w"] = round(speedup, 2)
            print(f"GRPO step env time, shipped engine vs speed-ups, {w} worker(s): {speedup:.2f}x lower")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
