"""What a comparison measured: ``summary.json``, ``report.md`` (the paper's Tables 1, 2, 3
and 5) and figures, all read back from the comparison's folder (see :mod:`hp_agent.reports.compare`).

Wall time is the trainer's own per-step time (``time/total``, summed over the steps of
the run) and CPU time its per-step CPU time (``cpu/step_s``: the trainer process and its
env workers); set-up and evaluation are excluded from both (``segments.jsonl`` has the
whole stretches). A gradient record is one row of the trainer's ``grad_norms.jsonl``: one
record batch of ``learner.record_batch_size`` rollout slots inside an optimizer step, and a
zero-gradient record one whose own contribution to that step's gradient was exactly 0. Avg@k is the mean success over k samples per task
(the unbiased Pass@1); the interval is its Wilson 95% interval counting tasks as the trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hp_agent.evaluation import improvement_p_value
from hp_agent.files import atomic_file, atomic_write_text, read_jsonl_records
from hp_agent.reports.compare_config import CompareConfig, read_evaluations, read_start_evaluation

REFERENCE = "hp-rlvr"  # the method whose wall and CPU time the others' are divided by
# Table 2's phases: (name in the paper, the trainer's timer).
PHASES: tuple[tuple[str, str], ...] = (
    ("rollout generation", "time/generation"),
    ("env stepping", "time/env_step"),
    ("hindsight scoring", "time/hindsight"),
    ("behaviour-policy replay", "time/replay"),
    ("training", "time/train"),
    ("weight sync", "time/weight_sync"),
    ("credit viewer", "time/views"),  # off in comparisons; here so that the phases always add up to time/total
    ("residual", "time/residual"),
)


def _scores(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Metric name -> value and interval, for one evaluation point."""
    scores: dict[str, dict[str, Any]] = {}
    for split, result in results.items():
        k = result.samples
        name = f"{split} success" if k == 1 else f"{split} Avg@{k}"
        scores[name] = {"value": result.avg_at_k, "ci95": list(result.success_ci95), "tasks": result.tasks}
        if k > 1:
            scores[f"{split} Pass@{k}"] = {"value": result.pass_at_k, "ci95": None, "tasks": result.tasks}
    return scores


def summarize_method(config: CompareConfig, method: str) -> dict[str, Any]:
    run_dir = config.run_dir(method)
    steps = read_jsonl_records(run_dir / "metrics.jsonl", missing_ok=True)
    grads = read_jsonl_records(run_dir / "grad_norms.jsonl", missing_ok=True)
    wall_before: dict[int, float] = {}  # training wall time spent before each step
    total = 0.0
    for row in sorted(steps, key=lambda r: r["step"]):
        wall_before[row["step"]] = total
        total += row.get("time/total", 0.0)
    spec, train_config = config.method(method), config.train_config(method)
    episodes_per_step = train_config.trainer.prompts_per_step * spec.group_size
    evaluations = []
    for point, results in sorted(read_evaluations(config, method).items()):
        wall = wall_before.get(point, total)
        evaluations.append({"step": point, "episodes": point * episodes_per_step, "train_wall_s": wall,
                            "scores": _scores(results)})
    best: dict[str, dict[str, Any]] = {}
    for evaluation in evaluations:
        for name, score in evaluation["scores"].items():
            if name not in best or score["value"] > best[name]["value"]:
                best[name] = {**score, "step": evaluation["step"]}
    cpu = sum(row.get("cpu/step_s", 0.0) for row in steps)
    return {
        "algo": spec.algo,
        "group_size": spec.group_size,
        "episodes_per_step": episodes_per_step,
        "trained_steps": len(steps),
        "wall_s": total,
        "cpu_s": cpu,
        "cpu_hours": cpu / 3600,
        "phases_s": {name: sum(row.get(key, 0.0) for row in steps) for name, key in PHASES},
        "zero_grad_records": sum(1 for g in grads if g["grad_norm"] == 0.0),
        "grad_records": len(grads),
        "evaluations": evaluations,
        "best": best,
    }


def gain_p_values(start: dict[str, dict[str, Any]], last: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Metric -> one-sided p of "no gain over the start" (tasks as the trials, as the intervals count them)."""
    return {name: improvement_p_value(start[name]["value"] * start[name]["tasks"], start[name]["tasks"],
                                      score["value"] * score["tasks"], score["tasks"])
            for name, score in last.items() if score["ci95"] is not None and name in start}


def summarize(config: CompareConfig) -> dict[str, Any]:
    methods = {method: summarize_method(config, method) for method in config.methods}
    start = _scores(read_start_evaluation(config))
    for m in methods.values():  # judged at the last point, not the best: a best over several points is biased upwards
        m["gain_p_last"] = gain_p_values(start, m["evaluations"][-1]["scores"]) if m["evaluations"] else {}
    summary: dict[str, Any] = {"env": config.env, "steps": config.steps, "eval_points": config.eval_points(),
                               "overrides": config.overrides, "start": start, "methods": methods}
    if REFERENCE in methods and methods[REFERENCE]["wall_s"] > 0:
        hp = methods[REFERENCE]
        summary["over_hp_rlvr"] = {name: {"wall": m["wall_s"] / hp["wall_s"], "cpu": m["cpu_s"] / hp["cpu_s"] if hp["cpu_s"] > 0 else None}
                                   for name, m in methods.items() if name != REFERENCE}
    return summary


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _score_cell(score: dict[str, Any] | None) -> str:
    if score is None:
        return "-"
    interval = f" [{100 * score['ci95'][0]:.1f}, {100 * score['ci95'][1]:.1f}]" if score.get("ci95") else ""
    where = f" (step {score['step']})" if "step" in score else ""
    return f"{_percent(score['value'])}{interval}{where}"


def report_markdown(config: CompareConfig, summary: dict[str, Any]) -> str:
    methods: dict[str, dict[str, Any]] = summary["methods"]
    names = list(methods)
    title = " vs ".join(f"{name} (G={methods[name]['group_size']})" for name in names)
    ratios = summary.get("over_hp_rlvr", {})
    lines = [f"# {config.env}: {title}", "",
             f"{config.steps} steps each; evaluated after steps {', '.join(map(str, summary['eval_points']))}; "
             f"shared overrides: `{' '.join(config.overrides) or 'none'}`.", "",
             "## Table 1: training cost", "",
             f"| method | rule | G | episodes/step | steps | wall time (s) | CPU time (s) | CPU-hours | wall / {REFERENCE} "
             f"| CPU / {REFERENCE} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in methods.items():
        ratio = ratios.get(name)
        wall = "1.00x" if name == REFERENCE else "-" if ratio is None else f"{ratio['wall']:.2f}x"
        cpu = "1.00x" if name == REFERENCE else "-" if ratio is None or ratio["cpu"] is None else f"{ratio['cpu']:.2f}x"
        lines.append(f"| {name} | {m['algo']} | {m['group_size']} | {m['episodes_per_step']} | "
                     f"{m['trained_steps']} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['cpu_hours']:.4f} | {wall} | {cpu} |")
    lines += ["", "## Table 2: time per phase (s, share of the step)", "",
              "| phase | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for phase, _ in PHASES:
        cells = []
        for m in methods.values():
            seconds, whole = m["phases_s"][phase], sum(m["phases_s"].values())
            cells.append(f"{seconds:.1f} ({_percent(seconds / whole) if whole else '-'})")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    metrics = list(dict.fromkeys(name for m in methods.values() for name in m["best"]))
    start = summary.get("start", {})
    lines += ["", "## Table 3: best score over the evaluations (95% interval)", "",
              "| metric | start | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for metric in metrics:
        cells = [_score_cell(start.get(metric))] + [_score_cell(m["best"].get(metric)) for m in methods.values()]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    gains = [f"{name} " + ", ".join(f"{metric} {p:.3f}" for metric, p in m["gain_p_last"].items())
             for name, m in methods.items() if m["gain_p_last"]]
    if gains:
        lines += ["", "One-sided p of a gain over the start at each method's last evaluation (two-proportion z-test, "
                  f"tasks as trials): {'; '.join(gains)}."]
    lines += ["", "## Table 5: zero-gradient records", "", "| method | zero-gradient | all records | fraction |", "|---|---|---|---|"]
    for name, m in methods.items():
        fraction = m["zero_grad_records"] / m["grad_records"] if m["grad_records"] else None
        lines.append(f"| {name} | {m['zero_grad_records']} | {m['grad_records']} | {_percent(fraction)} |")
    lines += ["", "## Every evaluation", "", "Equal optimizer steps share a row's step; equal episodes are read along "
              "the episodes column (and `score_vs_episodes.png`).", "",
              "| method | step | episodes | training wall time (s) | " + " | ".join(metrics) + " |",
              "|---|---|---|---|" + "---|" * len(metrics)]
    if start:
        lines.append("| start | 0 | 0 | 0.0 | " + " | ".join(_score_cell(start.get(metric)) for metric in metrics) + " |")
    for name, m in methods.items():
        for evaluation in m["evaluations"]:
            cells = [_score_cell(evaluation["scores"].get(metric)) for metric in metrics]
            lines.append(f"| {name} | {evaluation['step']} | {evaluation['episodes']} | {evaluation['train_wall_s']:.1f} | "
                         + " | ".join(cells) + " |")
    lines += ["", "Figures: `score_vs_time.png`, `score_vs_episodes.png`, `zero_grad.png`, `phases.png`.", ""]
    return "\n".join(lines)


def write_figures(config: CompareConfig, summary: dict[str, Any]) -> list[Path]:
    """Score versus training wall time, zero-gradient fractions, phase breakdown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods: dict[str, dict[str, Any]] = summary["methods"]
    metrics = list(dict.fromkeys(name for m in methods.values() for name in m["best"]))
    written = []
    for x, label, name in (("train_wall_s", "training wall time (s)", "score_vs_time.png"),
                           ("episodes", "training episodes", "score_vs_episodes.png")):
        figure, axes = plt.subplots(1, max(len(metrics), 1), figsize=(4.5 * max(len(metrics), 1), 3.6), squeeze=False)
        for axis, metric in zip(axes[0], metrics):
            for method, m in methods.items():
                points = [(0.0, summary["start"][metric]["value"])] if metric in summary.get("start", {}) else []
                points += [(e[x], e["scores"][metric]["value"]) for e in m["evaluations"] if metric in e["scores"]]
                if points:
                    axis.plot(*zip(*points), marker="o", label=method)
            axis.set(title=metric, xlabel=label, ylabel="score", ylim=(0, 1))
            axis.legend()
        written.append(save_figure(figure, config.out / name))

    figure, axis = plt.subplots(figsize=(4.5, 3.2))
    fractions = [m["zero_grad_records"] / m["grad_records"] if m["grad_records"] else 0.0 for m in methods.values()]
    axis.bar(list(methods), fractions)
    axis.set(title="zero-gradient records", ylabel="fraction of all records", ylim=(0, 1))
    written.append(save_figure(figure, config.out / "zero_grad.png"))

    figure, axis = plt.subplots(figsize=(8.5, 1.4 + 0.6 * len(methods)))
    left = [0.0] * len(methods)
    for phase, _ in PHASES:
        seconds = [m["phases_s"][phase] for m in methods.values()]
        axis.barh(list(methods), seconds, left=left, label=phase)
        left = [a + b for a, b in zip(left, seconds)]
    axis.set(title="time per phase", xlabel="seconds")
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    written.append(save_figure(figure, config.out / "phases.png"))
    return written


def save_figure(figure: Any, path: Path) -> Path:
    """Write a PNG through a temporary file and a rename; close the figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    with atomic_file(path, "wb") as f:
        figure.savefig(f, format="png", dpi=100)
    plt.close(figure)
    return path


def write_report(config: CompareConfig, summary: dict[str, Any]) -> None:
    atomic_write_text(config.out / "report.md", report_markdown(config, summary))
    write_figures(config, summary)
