"""``hp-agent report RUN [RUN ...]``: figures of training runs, overlaid, and a page that holds them.

Read back from each run folder (``metrics.jsonl``, ``grad_norms.jsonl``,
``credit_views.jsonl``, ``config.yaml``, an ``eval.json`` if one was written there), so a
report can be made of a run while it trains or long after:

* ``curves.png``: reward and success rate over steps and over training wall time (the
  trainer's own ``time/total``, summed);
* ``phases.png``: seconds per phase over the whole run, stacked, one bar per run;
* ``grad_norms.png``: every optimizer step's gradient norm, zero-gradient records marked;
* ``jsd_weights.png``: JSD weights of the recorded action tokens, successful and failed
  trajectories apart (rules with hindsight only);
* ``index.html``: the figures, each run's final metrics, evaluation and config.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from hp_agent.credit_view import VIEWS_FILE
from hp_agent.errors import UserFileNotFoundError, UserValueError
from hp_agent.files import atomic_write_text, read_jsonl_records
from hp_agent.reports.compare_report import save_figure

FINAL_KEYS = ("rollout/reward_mean", "rollout/success_rate", "train/grad_norm", "train/zero_grad_records_total",
              "train/grad_records_total", "time/total")


def _check_runs(runs: list[Path]) -> list[Path]:
    if not runs:
        raise UserValueError("report needs at least one run folder")
    for run in runs:
        if not (run / "metrics.jsonl").is_file():
            raise UserFileNotFoundError(f"{str(run)!r} is not a run folder with metrics (no metrics.jsonl)")
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise UserValueError(f"runs must have distinct folder names to be told apart: {', '.join(names)}")
    return runs


def _curves(runs: list[Path], plt: Any) -> Any:
    figure, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharey="row")
    for run in runs:
        metrics = read_jsonl_records(run / "metrics.jsonl", missing_ok=True)
        steps = [m["step"] for m in metrics]
        wall, total = [], 0.0
        for m in metrics:
            total += m.get("time/total", 0.0)
            wall.append(total)
        for row, key in enumerate(("rollout/reward_mean", "rollout/success_rate")):
            values = [m.get(key, float("nan")) for m in metrics]
            axes[row][0].plot(steps, values, marker=".", label=run.name)
            axes[row][1].plot(wall, values, marker=".", label=run.name)
            axes[row][0].set(xlabel="step", ylabel=key)
            axes[row][1].set(xlabel="training wall time (s)")
    axes[0][0].legend(fontsize="small")
    return figure


def _phases(runs: list[Path], plt: Any) -> Any:
    sums = []
    for run in runs:
        totals: dict[str, float] = {}
        for m in read_jsonl_records(run / "metrics.jsonl", missing_ok=True):
            for key, value in m.items():
                if key.startswith("time/") and key != "time/total":
                    totals[key.removeprefix("time/")] = totals.get(key.removeprefix("time/"), 0.0) + value
        sums.append(totals)
    phases = list(dict.fromkeys(phase for totals in sums for phase in totals))
    figure, axis = plt.subplots(figsize=(9, 1.6 + 0.6 * len(runs)))
    left = [0.0] * len(runs)
    for phase in phases:
        seconds = [totals.get(phase, 0.0) for totals in sums]
        axis.barh([run.name for run in runs], seconds, left=left, label=phase)
        left = [a + b for a, b in zip(left, seconds)]
    axis.set(title="seconds per phase, whole run", xlabel="seconds")
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def _grad_norms(runs: list[Path], plt: Any) -> Any:
    figure, axis = plt.subplots(figsize=(9, 3.4))
    for run in runs:
        records = read_jsonl_records(run / "grad_norms.jsonl", missing_ok=True)
        norms = [r["grad_norm"] for r in records]
        (line,) = axis.plot(range(len(norms)), norms, marker=".", linewidth=0.8, label=run.name)
        zeros = [i for i, norm in enumerate(norms) if norm == 0.0]
        axis.scatter(zeros, [0.0] * len(zeros), marker="x", color=line.get_color(), s=30,
                     label=f"{run.name}: {len(zeros)} of {len(norms)} zero-gradient")
    axis.set(title="gradient norm of every optimizer step (x: exactly zero)", xlabel="optimizer step (record)",
             ylabel="total gradient norm")
    axis.legend(fontsize="small")
    return figure


def _jsd_weights(runs: list[Path], plt: Any) -> Any | None:
    weighted = []
    for run in runs:
        kinds: dict[str, list[float]] = {"success": [], "failure": []}
        for view in read_jsonl_records(run / VIEWS_FILE, missing_ok=True):
            for turn in view["turns"]:
                kinds["success" if view["success"] else "failure"] += [t["weight"] for t in turn["tokens"]
                                                                       if t["weight"] is not None]
        if kinds["success"] or kinds["failure"]:
            weighted.append((run, kinds))
    if not weighted:
        return None
    figure, axes = plt.subplots(1, len(weighted), figsize=(4.6 * len(weighted), 3.4), squeeze=False)
    for axis, (run, kinds) in zip(axes[0], weighted):
        for kind, colour in (("success", "tab:green"), ("failure", "tab:red")):
            if kinds[kind]:
                axis.hist(kinds[kind], bins=20, range=(0, 1), alpha=0.55, color=colour,
                          label=f"{kind} ({len(kinds[kind])} tokens)")
        axis.set(title=f"{run.name}: JSD weights", xlabel="normalized JSD weight", ylabel="tokens")
        axis.legend(fontsize="small")
    return figure


def _run_section(run: Path) -> str:
    metrics = read_jsonl_records(run / "metrics.jsonl", missing_ok=True)
    final = metrics[-1] if metrics else {}
    rows = "".join(f"<tr><td>{html.escape(key)}</td><td>{final[key]:.4g}</td></tr>" for key in FINAL_KEYS if key in final)
    evaluation = ""
    if (run / "eval.json").is_file():
        result = json.loads((run / "eval.json").read_text())
        evaluation = f"<h3>evaluation (eval.json)</h3><pre>{html.escape(json.dumps(result, indent=1)[:4000])}</pre>"
    config = (run / "config.yaml").read_text() if (run / "config.yaml").is_file() else "(no config.yaml)"
    return (f"<section><h2>{html.escape(run.name)}</h2><p>{len(metrics)} steps; folder {html.escape(str(run))}</p>"
            f"<table><tr><th>final step</th><th></th></tr>{rows}</table>{evaluation}"
            f"<details><summary>config.yaml</summary><pre>{html.escape(config)}</pre></details></section>")


def write_report(runs: list[Path], out: Path) -> Path:
    """Figures and ``index.html`` of ``runs`` (overlaid) in folder ``out``; returns the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _check_runs([Path(run) for run in runs])
    out.mkdir(parents=True, exist_ok=True)
    figures = {"curves.png": _curves(runs, plt), "phases.png": _phases(runs, plt),
               "grad_norms.png": _grad_norms(runs, plt), "jsd_weights.png": _jsd_weights(runs, plt)}
    images = []
    for name, figure in figures.items():
        if figure is not None:
            save_figure(figure, out / name)
            images.append(f'<p><img src="{name}" alt="{name}"></p>')
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>hp-agent report</title><style>"
            "body{font:14px system-ui,sans-serif;margin:1.5rem;} img{max-width:100%;} td,th{padding:1px 8px;"
            "text-align:left;border-bottom:1px solid #eee;} pre{background:#f7f7f7;padding:.5rem;overflow:auto;}"
            f"</style></head><body><h1>report: {html.escape(', '.join(run.name for run in runs))}</h1>"
            + "".join(images) + "".join(_run_section(run) for run in runs) + "</body></html>")
    atomic_write_text(out / "index.html", page)
    return out / "index.html"
