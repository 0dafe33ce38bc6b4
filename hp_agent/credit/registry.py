"""The credit rules ``algo.name`` selects, registered here without importing torch, so that
the config (and everything that only reads it) stays light. The rules themselves are tensor
functions in :mod:`hp_agent.credit.rules`; a built-in rule names its function there and
is imported on first use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from typing import Any

# fn(batch: CreditBatch, options: CreditOptions) -> (credit [M], metrics)
CreditFn = Callable[[Any, Any], tuple[Any, dict[str, float]]]


@dataclass(frozen=True)
class CreditRule:
    """A registered credit rule: ``fn(batch, options) -> (credit [M], metrics)``.

    target:         the function, or ``"module:function"`` imported on first use.
    hindsight:      the rule reads ``batch.weights``, so the trainer runs hindsight scoring
                    (otherwise only the causal, behaviour-policy replay pass).
    group_size:     rollouts per prompt when ``algo.group_size`` is not set.
    min_group_size: smallest valid group (2 for a group-relative baseline).
    baseline_decay: the historical baseline's decay where ``baseline.decay`` is not set
                    (SPO's discounted tracker); None: its running mean, then EMA.
    """

    target: CreditFn | str
    hindsight: bool = False
    group_size: int = 1
    min_group_size: int = 1
    baseline_decay: float | None = None

    @property
    def fn(self) -> CreditFn:
        return _imported(self.target) if isinstance(self.target, str) else self.target


@cache
def _imported(reference: str) -> CreditFn:
    module, _, name = reference.partition(":")
    return getattr(import_module(module), name)


CREDIT_RULES: dict[str, CreditRule] = {
    "hp-rlvr": CreditRule("hp_agent.credit.rules:hp_rlvr_credit", hindsight=True),
    "grpo": CreditRule("hp_agent.credit.rules:grpo_credit", group_size=8, min_group_size=2),
    "reinforce": CreditRule("hp_agent.credit.rules:reinforce_credit"),
    "opsd": CreditRule("hp_agent.credit.related:opsd_credit", hindsight=True),
    "hcapo": CreditRule("hp_agent.credit.related:hcapo_credit", hindsight=True, group_size=8, min_group_size=2),
    "gigpo": CreditRule("hp_agent.credit.related:gigpo_credit", group_size=8, min_group_size=2),
    "spo": CreditRule("hp_agent.credit.related:spo_credit", baseline_decay=0.9),
}


def register_credit(name: str, *, hindsight: bool = False, group_size: int = 1, min_group_size: int = 1,
                    baseline_decay: float | None = None) -> Callable[[CreditFn], CreditFn]:
    """Decorator: make ``fn`` the credit rule ``algo.name=<name>`` selects."""

    def add(fn: CreditFn) -> CreditFn:
        CREDIT_RULES[name] = CreditRule(fn, hindsight, group_size, min_group_size, baseline_decay)
        return fn

    return add


def credit_rule(name: str) -> CreditRule:
    """The rule registered as ``name``; a KeyError lists the registered ones."""
    if name not in CREDIT_RULES:
        raise KeyError(f"unknown credit rule {name!r}; registered: {', '.join(sorted(CREDIT_RULES))}")
    return CREDIT_RULES[name]
