"""HP-RLVR (one rollout per prompt) against GRPO (a group of 8), run as the paper compares them.

``run_compare(CompareConfig(env=..., steps=N, out=DIR, overrides=[...]))`` trains each
method from the same model, seed and prompts per step, stops at 25/50/75/100% of the
steps to evaluate the checkpoint on the env's held-out splits, and writes into ``DIR``:

* ``runs/<method>/``: the trainer's run folders (metrics, grad-norm records, checkpoints);
* ``evals/<method>/step_<k>/<split>.json``: each evaluation, and ``evals/start/<split>.json``
  the starting model's (step 0 of both curves);
* ``segments.jsonl``: each stretch of training, set-up included: steps, wall and CPU
  seconds (this process and the env workers it waited for);
* ``summary.json``, ``report.md`` and PNG figures (:mod:`hp_agent.compare_report`).

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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hp_agent.config import ConfigError, TrainConfig, load_config
from hp_agent.evaluate import EvalResult, evaluate
from hp_agent.policies import SamplingParams
from hp_agent.runs import CHECKPOINT_PREFIX, atomic_write_text, checkpoint_dir, latest_checkpoint

# What each env is scored on: (split, samples per task). ALFWorld: success on ID and
# OOD games; math: Avg@4 and Pass@4; code: Pass@1 (Avg@8) and Pass@8. Other envs: their
# default held-out split, one sample.
EVAL_PLANS: dict[str, list[tuple[str | None, int]]] = {
    "alfworld": [("id", 1), ("ood", 1)],
    "math": [("test", 4)],
    "code": [("test", 8)],
    "keys": [("test", 1)],
    "keystep": [("test", 1)],
    "fetch": [("test", 1)],
}
SETTINGS_FILE = "compare.yaml"


class CompareConfig(BaseModel):
    """A comparison: which env, how long, where, and what both methods share."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("alfworld", description="Registered env name, trained and evaluated.")
    steps: int = Field(..., ge=1, description="Training steps of each method.")
    out: Path = Field(..., description="Folder receiving runs, evaluations, summary.json, report.md and figures.")
    methods: dict[str, int] = Field(
        default_factory=lambda: {"hp-rlvr": 1, "grpo": 8},
        description="Credit rule -> rollouts per prompt G (the paper: HP-RLVR G=1, GRPO G=8).",
    )
    eval_fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0],
                                        description="Evaluate after these fractions of the steps.")
    eval_splits: list[str] | None = Field(None, description="Splits to evaluate (default: EVAL_PLANS[env], else the env's held-out split).")
    eval_samples: int | None = Field(None, ge=1, description="Samples per task (default: EVAL_PLANS[env], else 1).")
    eval_limit: int | None = Field(None, ge=1, description="Only the first N tasks of each split (default: all).")
    eval_max_turns: int | None = Field(None, ge=1, description="A model's most turns per evaluation episode (default: the env's).")
    eval_greedy: bool = Field(False, description="Greedy evaluation instead of sampling at the rollout temperature.")
    overrides: list[str] = Field(default_factory=list, description="Dotted train-config overrides for both methods.")

    @field_validator("eval_fractions")
    @classmethod
    def _fractions(cls, fractions: list[float]) -> list[float]:
        if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
            raise ValueError(f"eval_fractions must be non-empty fractions in (0, 1], got {fractions}")
        return sorted(fractions)

    def eval_points(self) -> list[int]:
        """The training steps after which each method is evaluated."""
        return sorted({max(1, round(f * self.steps)) for f in self.eval_fractions})

    def eval_plan(self) -> list[tuple[str | None, int]]:
        plan = EVAL_PLANS.get(self.env, [(None, 1)])
        if self.eval_splits is not None:
            plan = [(split, plan[0][1]) for split in self.eval_splits]
        return [(split, self.eval_samples or samples) for split, samples in plan]

    def run_dir(self, method: str) -> Path:
        return self.out / "runs" / method

    def eval_path(self, method: str, step: int, split: str | None) -> Path:
        return self.out / "evals" / method / f"step_{step:06d}" / f"{split or 'default'}.json"

    def start_eval_path(self, split: str | None) -> Path:
        """The starting model's evaluation, shared by every method (step 0 of each curve)."""
        return self.out / "evals" / "start" / f"{split or 'default'}.json"

    def train_config(self, method: str, steps: int | None = None) -> TrainConfig:
        """The method's training config: shared overrides, then env, rule, G, run folder (and steps)."""
        fixed = [f"env.name={self.env}", f"algo.name={method}", f"algo.group_size={self.methods[method]}",
                 f"trainer.run_dir={self.run_dir(method).parent}", f"trainer.name={method}",
                 "trainer.views_per_step=0"]  # the credit viewer's cost is not training's: wall times measure training
        fixed += [f"trainer.steps={steps}"] if steps is not None else []
        return load_config(None, self.overrides + fixed)


def load_compare_config(path: Path | None, **fields: Any) -> CompareConfig:
    """A YAML file's settings (if any), then ``fields`` that are not None."""
    data: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"compare config {str(path)!r} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"compare config {str(path)!r} must hold a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    overrides = list(data.get("overrides", [])) + list(fields.pop("overrides", None) or [])
    data.update({key: value for key, value in fields.items() if value is not None})
    data["overrides"] = overrides
    try:
        config = CompareConfig.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            key = ".".join(str(part) for part in item["loc"]) or "(top level)"
            if item["type"] == "missing":
                problems.append(f"{key} is required (--{key.replace('_', '-')} or in --config)")
            elif item["type"] == "extra_forbidden":
                problems.append(f"unknown compare setting {key!r}; valid: {', '.join(CompareConfig.model_fields)}")
            else:
                problems.append(f"{key}: {item['msg']} (got {item.get('input')!r})")
        raise ConfigError("bad compare settings: " + "; ".join(problems)) from None
    for method in config.methods:
        config.train_config(method)  # a bad override or rule fails before anything runs
    return config


def _check_settings(config: CompareConfig) -> None:
    """Write the settings on first use; refuse to mix a different comparison into the folder."""
    path = config.out / SETTINGS_FILE
    current = json.loads(config.model_dump_json(exclude={"out"}))  # the folder may be named another way
    if path.is_file():
        saved = yaml.safe_load(path.read_text())
        if saved != current:
            changed = sorted(k for k in current if saved.get(k) != current.get(k))
            raise ConfigError(f"{str(config.out)!r} holds a comparison with other settings ({', '.join(changed)} "
                              "differ); resume it with the same settings or pick another --out")
        return
    atomic_write_text(path, yaml.safe_dump(current, sort_keys=False))


def _trained_steps(run_dir: Path) -> int:
    checkpoint = latest_checkpoint(run_dir)
    return int(checkpoint.name.removeprefix(CHECKPOINT_PREFIX)) if checkpoint is not None else 0


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
    """Evaluate ``method``'s checkpoint at ``step``; ``method=None``: the starting model."""
    train_config = config.train_config(method or next(iter(config.methods)))
    sampling = SamplingParams(train_config.rollout.max_new_tokens, train_config.rollout.temperature,
                              greedy=config.eval_greedy)
    for split, samples in config.eval_plan():
        output = config.eval_path(method, step, split) if method else config.start_eval_path(split)
        if output.is_file():
            continue
        model = str(checkpoint_dir(config.run_dir(method), step) / "model") if method else train_config.model.name
        if method and not Path(model).is_dir():
            raise FileNotFoundError(f"no checkpoint of {method} at step {step} ({model}) to evaluate")
        evaluate(env=config.env, model=model, split=split, samples=samples, limit=config.eval_limit,
                 env_kwargs=_eval_env_kwargs(train_config), sampling=sampling, seed=train_config.trainer.seed,
                 max_turns=config.eval_max_turns, output=output, progress=progress)


# Training env kwargs that pick the training sample or shorten its episodes: evaluation
# plays the full held-out split under the env's own step limit (see eval_max_turns).
TRAINING_ONLY_KWARGS = ("split", "num_games", "task_types", "max_steps")


def _eval_env_kwargs(train_config: TrainConfig) -> dict[str, Any]:
    """The training env's kwargs that define the game (source, prompt mode, rewards)."""
    return {key: value for key, value in train_config.env.kwargs.items() if key not in TRAINING_ONLY_KWARGS}


def run_compare(config: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate every method at every point (skipping what is done); write the report."""
    from hp_agent.compare_report import summarize, write_report

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


def read_start_evaluation(config: CompareConfig) -> dict[str, EvalResult]:
    """Split -> result of the starting model, as far as it is on disk."""
    paths = {split or "default": config.start_eval_path(split) for split, _ in config.eval_plan()}
    return {split: EvalResult.from_dict(json.loads(path.read_text())) for split, path in paths.items() if path.is_file()}


def read_evaluations(config: CompareConfig, method: str) -> dict[int, dict[str, EvalResult]]:
    """Step -> split -> result, for the evaluations of ``method`` on disk."""
    found: dict[int, dict[str, EvalResult]] = {}
    for point in config.eval_points():
        for split, _ in config.eval_plan():
            path = config.eval_path(method, point, split)
            if path.is_file():
                found.setdefault(point, {})[split or "default"] = EvalResult.from_dict(json.loads(path.read_text()))
    return found

