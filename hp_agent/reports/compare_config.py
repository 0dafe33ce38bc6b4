"""What a comparison is (:class:`CompareConfig`: env, steps, methods, evaluation points),
where its files go, and the readers of its evaluations (:mod:`hp_agent.reports.compare`
runs it, :mod:`hp_agent.reports.compare_report` reports it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hp_agent.config import ConfigError, TrainConfig, load_config, validation_problems
from hp_agent.envs import env_factory, split_env_spec
from hp_agent.evaluation import EvalResult

SETTINGS_FILE = "compare.yaml"


class MethodSpec(BaseModel):
    """One method of a comparison, by name: a credit rule, its G, and overrides of its own."""

    model_config = ConfigDict(extra="forbid")

    algo: str | None = Field(None, description="Credit rule (algo.name); default: the method's name.")
    group_size: int = Field(1, ge=1, description="Rollouts per prompt G.")
    overrides: list[str] = Field(default_factory=list, description="Dotted train-config overrides of this method alone, "
                                 "after the shared ones (e.g. learner.distill_coef=0.1).")


class CompareConfig(BaseModel):
    """A comparison: which env, how long, where, and what both methods share."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("alfworld", description="Registered env name, trained and evaluated.")
    steps: int = Field(..., ge=1, description="Training steps of each method.")
    out: Path = Field(..., description="Folder receiving runs, evaluations, summary.json, report.md and figures.")
    methods: dict[str, int | MethodSpec] = Field(
        default_factory=lambda: {"hp-rlvr": 1, "grpo": 8},
        description="Method name -> rollouts per prompt G, the name being a credit rule (the paper: HP-RLVR G=1, GRPO "
        "G=8), or -> {algo, group_size, overrides}: a named configuration (e.g. two of one rule). Any number of methods.",
    )
    eval_fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0],
                                        description="Evaluate after these fractions of the steps.")
    eval_splits: list[str] | None = Field(None, description="Splits to evaluate (default: the env's compare_splits, else its eval_split).")
    eval_samples: int | None = Field(None, ge=1, description="Samples per task (default: the env's eval_samples).")
    eval_limit: int | None = Field(None, ge=1, description="Only the first N tasks of each split (default: all).")
    eval_max_turns: int | None = Field(None, ge=1, description="A model's most turns per evaluation episode (default: the env's).")
    eval_greedy: bool = Field(False, description="Greedy evaluation instead of sampling at the rollout temperature.")
    eval_workers: int = Field(1, ge=1, description="Copies of the model evaluating in parallel, each a share of the episodes "
                              "(sampled results repeat for the same count, as `hp-agent eval --workers` says).")
    overrides: list[str] = Field(default_factory=list, description="Dotted train-config overrides for both methods.")

    @field_validator("eval_fractions")
    @classmethod
    def _fractions(cls, fractions: list[float]) -> list[float]:
        if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
            raise ValueError(f"eval_fractions must be non-empty fractions in (0, 1], got {fractions}")
        return sorted(fractions)

    def method(self, name: str) -> MethodSpec:
        """The method called ``name``: its rule, G and own overrides."""
        spec = self.methods[name]
        return MethodSpec(algo=name, group_size=spec) if isinstance(spec, int) else spec.model_copy(
            update={"algo": spec.algo or name})

    def eval_points(self) -> list[int]:
        """The training steps after which each method is evaluated."""
        return sorted({max(1, round(f * self.steps)) for f in self.eval_fractions})

    def eval_plan(self) -> list[tuple[str | None, int]]:
        """(split, samples per task) of each evaluation, as the env declares them unless set here."""
        env = env_factory(split_env_spec(self.env, {})[0])
        splits: list[str | None] = list(self.eval_splits or getattr(env, "compare_splits", ()) or [getattr(env, "eval_split", None)])
        return [(split, self.eval_samples or getattr(env, "eval_samples", 1)) for split in splits]

    def run_dir(self, method: str) -> Path:
        return self.out / "runs" / method

    def eval_path(self, method: str, step: int, split: str | None) -> Path:
        return self.out / "evals" / method / f"step_{step:06d}" / f"{split or 'default'}.json"

    def start_eval_path(self, split: str | None) -> Path:
        """The starting model's evaluation, shared by every method (step 0 of each curve)."""
        return self.out / "evals" / "start" / f"{split or 'default'}.json"

    def train_config(self, method: str, steps: int | None = None) -> TrainConfig:
        """The method's training config: shared overrides, its own, then env, rule, G, run folder (and steps)."""
        spec = self.method(method)
        fixed = [f"env.name={self.env}", f"algo.name={spec.algo}", f"algo.group_size={spec.group_size}",
                 f"trainer.run_dir={self.run_dir(method).parent}", f"trainer.name={method}",
                 "trainer.views_per_step=0"]  # the credit viewer's cost is not training's: wall times measure training
        fixed += [f"trainer.steps={steps}"] if steps is not None else []
        return load_config(None, self.overrides + spec.overrides + fixed)


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
        problems = validation_problems(error, CompareConfig, "compare setting", " ({flag} or in --config)")
        raise ConfigError("bad compare settings: " + "; ".join(problems)) from None
    for method in config.methods:
        config.train_config(method)  # a bad override or rule fails before anything runs
    return config


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
