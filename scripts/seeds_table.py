"""One markdown table of several `hp-agent compare` runs of the same methods (e.g. seeds):
each method's last evaluation with its 95% interval per run, its wall and CPU time over
HP-RLVR's, and its zero-gradient records, read from each run's summary.json.

Usage: .venv/bin/python scripts/seeds_table.py OUT [OUT ...]   (docs/results.md, issue 47)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def cell(score: dict) -> str:
    value, (low, high) = score["value"], score["ci95"]
    return f"{100 * value:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def table(summaries: list[dict]) -> list[str]:
    metric = next(iter(summaries[0]["start"]))
    runs = range(len(summaries))
    lines = ["| method | G | episodes/step | " + " | ".join(f"run {i + 1}: {metric}" for i in runs)
             + " | wall / hp-rlvr | CPU / hp-rlvr | zero-gradient records |",
             "|---|---|---|" + "---|" * (len(summaries) + 3),
             "| start | | | " + " | ".join(cell(s["start"][metric]) for s in summaries) + " | | | |"]
    for name, method in summaries[0]["methods"].items():
        present = [s for s in summaries if name in s["methods"] and s["methods"][name]["evaluations"]]
        scores = [cell(s["methods"][name]["evaluations"][-1]["scores"][metric]) if s in present else "-" for s in summaries]

        def ratio(kind: str) -> str:
            return " / ".join(f"{s['over_hp_rlvr'][name][kind]:.2f}x" if name in s["over_hp_rlvr"] else "1.00x" for s in present)

        zero = " / ".join(f"{s['methods'][name]['zero_grad_records']}/{s['methods'][name]['grad_records']}" for s in present)
        per_step = method["evaluations"][-1]["episodes"] // method["evaluations"][-1]["step"] if method["evaluations"] else "-"
        lines.append(f"| {name} | {method['group_size']} | {per_step} | " + " | ".join(scores)
                     + f" | {ratio('wall')} | {ratio('cpu')} | {zero} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table([json.loads((Path(out) / "summary.json").read_text()) for out in sys.argv[1:]])))
