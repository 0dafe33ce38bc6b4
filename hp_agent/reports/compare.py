"""HP-RLVR (one rollout per prompt) against GRPO (a group of 8), run as the paper compares them.

``run_compare(CompareConfig(env=..., steps=N, out=DIR, overrides=[...]))`` (the config:
:mod:`hp_agent.reports.compare_config`) trains each
method from the same model, seed and prompts per step, stops at 25/50/75/100% of the
steps to evaluate the checkpoint on the env's held-out splits, and writes into ``DIR``:

* ``runs/<method>/``: the trainer's run folders (metrics, grad-norm records, checkpoints);
* ``evals/<method>/step_<k>/<split>.json``: each evaluation, and ``evals/start/<split>.json``
  the starting model's (step 0 of both curves);
* ``segments.jsonl``: each stretch of training, set-up included: steps, wall and CPU
  seconds (this process and the env workers it waited for);
* ``summary.json``, ``report.md`` and PNG figures (:mod:`hp_agent.reports.compare_report`).

Everything is resumable: a finished evaluation is never redone, training continues from
the run's last checkpoint, and a rerun with the same settings only fills in what is
missing (different settings in the same folder are refused).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any
import yaml

from hp_agent.config import ConfigError, TrainConfig
from hp_agent.evaluation import RunPlay, evaluate
from hp_agent.files import atomic_write_text
from hp_agent.policies import LoadOptions, SamplingParams
from hp_agent.reports.compare_config import SETTINGS_FILE, CompareConfig
from hp_agent.reports.compare_report import summarize, write_report
from hp_agent.run_folder import checkpoint_dir, checkpoint_step, latest_checkpoint


def _check_settings(config: CompareConfig) -> None:
    """Write the settings on first use; refuse to mix a different comparison into the folder.

    New methods may join a comparison: the start's evaluation and every method already there
    stay valid as long as nothing else changes, so the folder's settings gain the new ones.
    """
    path = config.out / SETTINGS_FILE
    current = json.loads(config.model_dump_json(exclude={"out"}))  # the folder may be named another way
    if path.is_file():
        saved = yaml.safe_load(path.read_text())
        changed = sorted(k for k in current if saved.get(k) != current.get(k))
        if changed == ["methods"] and _only_added(saved["methods"], current["methods"]):
            atomic_write_text(path, yaml.safe_dump(current, sort_keys=False))
        elif changed:
            raise ConfigError(f"{str(config.out)!r} holds a comparison with other settings ({', '.join(changed)} "
                              "differ); resume it with the same settings (methods may only be added) "
                              "or pick another --out")
        return
    atomic_write_text(path, yaml.safe_dump(current, sort_keys=False))


def _only_added(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether ``current`` holds every method of ``saved``, each as it was, and more."""
    return all(name in current and current[name] == spec for name, spec in saved.items())


def _trained_steps(run_dir: Path) -> int:
    checkpoint = latest_checkpoint(run_dir)
    return checkpoint_step(checkpoint) if checkpoint is not None else 0


def _cpu_seconds_with_children() -> float:
    """CPU time of this process and of the children it has waited for (env workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _train_to(config: CompareConfig, method: str, step: int, progress: bool) -> None:
    """Train ``method`` until its run has a checkpoint at ``step``; log the stretch's cost."""
    from hp_agent.trainer import train

    run_dir = config.run_dir(method)
    start = _trained_steps(run_dir)
    if start >= step:
        return
    wall, cpu = time.perf_counter(), _cpu_seconds_with_children()
    train(config.train_config(method, steps=step), resume=run_dir if (run_dir / "config.yaml").is_file() else None, progress=progress)
    record = {"method": method, "from_step": start, "to_step": step,
              "wall_s": time.perf_counter() - wall, "cpu_s": _cpu_seconds_with_children() - cpu}
    with (config.out / "segments.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _evaluate_at(config: CompareConfig, method: str | None, step: int, progress: bool) -> None:
    """Evaluate ``method``'s checkpoint at ``step``; ``method=None``: the starting model.
    Evaluation plays as training's rollouts do (:class:`~hp_agent.evaluation.RunPlay`), on
    the device, dtype and backend the runs train with."""
    train_config = config.train_config(method or next(iter(config.methods)))
    play = RunPlay.of(train_config)
    sampling = SamplingParams(play.max_new_tokens, play.temperature, greedy=config.eval_greedy)
    load = LoadOptions.from_model_config(train_config.model)
    for split, samples in config.eval_plan():
        output = config.eval_path(method, step, split) if method else config.start_eval_path(split)
        if output.is_file():
            continue
        model = str(checkpoint_dir(config.run_dir(method), step) / "model") if method else train_config.model.name
        if method and not Path(model).is_dir():
            raise FileNotFoundError(f"no checkpoint of {method} at step {step} ({model}) to evaluate")
        evaluate(env=config.env, model=model, split=split, samples=samples, limit=config.eval_limit,
                 env_kwargs=play.env_kwargs, sampling=sampling, seed=train_config.trainer.seed,
                 max_turns=config.eval_max_turns, output=output, progress=progress, workers=config.eval_workers,
                 constrain=play.constrain, chat_history=play.chat_history, load=load)


def run_compare(config: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate every method at every point (skipping what is done); write the report."""
    config.out.mkdir(parents=True, exist_ok=True)
    _check_settings(config)
    _evaluate_at(config, None, 0, progress)
    for point in config.eval_points():
        for method in config.methods:  # interleaved: an interrupted comparison has both curves so far
            _train_to(config, method, point, progress)
            _evaluate_at(config, method, point, progress)
    summary = summarize(config)
    atomic_write_text(config.out / "summary.json", json.dumps(summary, indent=1))
    write_report(config, summary)
    return summary
