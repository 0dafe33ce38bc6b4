"""The historical baseline b of HP-RLVR (DESIGN.md step 5): a running reward estimate per
task, task type and environment, read for a batch before that batch updates it."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class HistoricalBaseline:
    """Running reward baseline b per task, falling back to task type, then environment.

    It starts unbiased, with no invented prior: a level's estimate is set by the rewards
    it observes. The first update of a level starts it from what the coarser levels hold
    (counted as ``prior_weight`` past rewards, 0 for none), or, when nothing is known
    yet, from that first reward alone; it then moves as v <- v + max(rate, 1 / n) (R - v),
    n the count: a running mean, then an exponential moving average. With ``decay`` rho
    (SPO's tracker) the count is discounted instead, n <- rho n + 1, and v <- v + (R - v) / n:
    a discounted mean of the rewards, for rewards in [0, 1] the mean of a Beta(alpha, beta)
    whose alpha and beta decay by rho before each observation. ``initial``, when the
    user gives one, is the value read before anything is observed.

    The caller reads b for a batch (:meth:`batch_values`) before calling ``update`` with
    its rewards, so a reward never centers itself.
    """

    rate: float = 0.1
    initial: float | None = None
    prior_weight: float = 1.0
    decay: float | None = None
    estimates: dict[str, list[float]] = field(default_factory=dict)  # key -> [count, value]

    @staticmethod
    def keys(env: str, task_type: str, task_id: str) -> tuple[str, str, str]:
        return f"task:{env}/{task_id}", f"type:{env}/{task_type}", f"env:{env}"

    def _read(self, keys: tuple[str, ...]) -> float | None:
        for key in keys:
            if key in self.estimates:
                return self.estimates[key][1]
        return self.initial

    def value(self, env: str, task_type: str, task_id: str) -> float | None:
        """b for one task, or None when nothing has been observed (and no ``initial``)."""
        return self._read(self.keys(env, task_type, task_id))

    def batch_values(self, tasks: list[tuple[str, str, str]], rewards: list[float]) -> list[float]:
        """b for each ``(env, task_type, task_id)`` of a batch, read before any update.

        A trajectory of an env with no estimate yet (the run's first step) gets the mean
        reward of the batch's other trajectories of that env: leave-one-out, so it does
        not depend on its own reward and stays unbiased; alone, it gets its own reward
        (no credit).
        """
        values = [self.value(*task) for task in tasks]
        for i, value in enumerate(values):
            if value is None:
                others = [r for j, r in enumerate(rewards) if j != i and tasks[j][0] == tasks[i][0]]
                values[i] = sum(others) / len(others) if others else rewards[i]
        return values  # type: ignore[return-value]

    def update(self, env: str, task_type: str, task_id: str, reward: float) -> None:
        keys = self.keys(env, task_type, task_id)
        starts = [self._read(keys[level + 1 :]) for level in range(len(keys))]  # before any change
        for key, start in zip(keys, starts):
            count, value = self.estimates.get(key, [self.prior_weight, start] if start is not None else [0.0, 0.0])
            if self.decay is None:
                count += 1
                value += max(self.rate, 1.0 / count) * (reward - value)
            else:
                count = self.decay * count + 1
                value += (reward - value) / count
            self.estimates[key] = [count, value]

    def state_dict(self) -> dict:
        return {"rate": self.rate, "initial": self.initial, "prior_weight": self.prior_weight, "decay": self.decay,
                "estimates": self.estimates}

    def load_state_dict(self, state: dict) -> None:
        self.rate, self.initial, self.prior_weight = state["rate"], state["initial"], state["prior_weight"]
        self.decay = state.get("decay")  # checkpoints written before the decay existed had none
        self.estimates = {key: list(v) for key, v in state["estimates"].items()}
