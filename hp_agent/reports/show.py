"""``hp-agent show RUN``: one self-contained HTML page of a step's token credit.

Reads the run's ``credit_views.jsonl`` (written by the trainer, see
:mod:`hp_agent.credit_view`) and draws each recorded trajectory: per turn the observation
the policy answered, its action tokens shaded by their credit (green above zero, red
below, stronger for larger magnitudes, on one scale for the page), the action the env
parsed and the env's reply, and the privileged block the hindsight view read. Hovering
a token (or clicking it, to keep it) shows its credit, its JSD weight and the likeliest
next tokens under the causal and the hindsight view. The page loads nothing from the
network: style, script and data are inline.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from hp_agent.credit_view import VIEWS_FILE
from hp_agent.errors import UserFileNotFoundError, UserValueError
from hp_agent.files import atomic_write_text, read_jsonl_records

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 24rem 3rem 1.5rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.05rem; margin: 0 0 .4rem; }
.trajectory { border: 1px solid #ccc; border-radius: 6px; padding: .8rem 1rem; margin: 1rem 0; }
.trajectory.success { border-left: 6px solid #2a9d4b; } .trajectory.failure { border-left: 6px solid #c0392b; }
.turn { margin: .6rem 0 .9rem; padding-top: .4rem; border-top: 1px dashed #ddd; }
.label { color: #666; font-size: .8rem; text-transform: uppercase; letter-spacing: .04em; }
.text { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12.5px; background: #f7f7f7;
        padding: .3rem .5rem; border-radius: 4px; max-height: 14rem; overflow: auto; }
.tokens { font-family: ui-monospace, monospace; font-size: 13.5px; white-space: pre-wrap; line-height: 1.9; }
.tok { border-radius: 3px; padding: 1px 0; cursor: pointer; outline: 1px solid #e4e4e4; }
.tok.pinned { outline: 2px solid #1f5fbf; }
details.hindsight-block { margin-top: .3rem; } details.hindsight-block summary { cursor: pointer; color: #1f5fbf; }
#panel { position: fixed; top: 1rem; right: 1rem; width: 22rem; max-height: 92vh; overflow: auto; background: #fff;
         border: 1px solid #999; border-radius: 6px; padding: .7rem; box-shadow: 0 2px 10px rgba(0,0,0,.15); }
#panel table { border-collapse: collapse; width: 100%; margin-bottom: .5rem; }
#panel td, #panel th { border-bottom: 1px solid #eee; padding: 1px 4px; text-align: left; font-size: 12.5px; }
#panel .num { text-align: right; font-variant-numeric: tabular-nums; }
.legend span { display: inline-block; padding: 0 .4rem; margin-right: .3rem; border-radius: 3px; }
"""

SCRIPT = """
const panel = document.getElementById('panel');
let pinned = null;
function rows(title, view) {
  if (!view) return '<p><b>' + title + '</b>: not scored (no hindsight view in this rule)</p>';
  let out = '<table><tr><th colspan=2>' + title + ' view: p(chosen) = ' + view.p.toFixed(4) + '</th></tr>';
  for (const [text, p] of view.top) out += '<tr><td>' + escapeHtml(JSON.stringify(text)) + '</td><td class=num>' +
    p.toFixed(4) + '</td></tr>';
  return out + '</table>';
}
function escapeHtml(s) { const d = document.createElement('div'); d.textContent = s; return d.innerHTML; }
function show(tok) {
  const info = JSON.parse(tok.dataset.info);
  const weight = tok.dataset.weight === '' ? 'none' : Number(tok.dataset.weight).toFixed(4);
  panel.innerHTML = '<h2>token ' + escapeHtml(JSON.stringify(info.text)) + '</h2>' +
    '<p>credit <b class=credit>' + Number(tok.dataset.credit).toFixed(5) + '</b>, JSD weight <b class=weight>' +
    weight + '</b></p>' + rows('causal', info.causal) + rows('hindsight', info.hindsight);
}
for (const tok of document.querySelectorAll('.tok')) {
  tok.addEventListener('mouseenter', () => { if (!pinned) show(tok); });
  tok.addEventListener('click', () => {
    if (pinned) pinned.classList.remove('pinned');
    pinned = pinned === tok ? null : tok;
    if (pinned) { pinned.classList.add('pinned'); show(tok); }
  });
}
"""


def load_views(run_dir: Path, step: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(step, its trajectory views); ``step`` None: the last step recorded."""
    run_dir = Path(run_dir)
    path = run_dir / VIEWS_FILE
    if not path.is_file():
        raise UserFileNotFoundError(f"{str(run_dir)!r} has no {VIEWS_FILE}: the run recorded no credit views "
                                    "(trainer.views_per_step=0, or a run made before they existed)")
    records = read_jsonl_records(path)
    steps = sorted({record["step"] for record in records})
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise UserValueError(f"step {step} has no credit views in {str(path)!r}; steps with views: "
                             f"{', '.join(map(str, steps)) or 'none'}")
    return chosen, [record for record in records if record["step"] == chosen]


def _shade(credit: float, scale: float) -> str:
    if credit == 0.0 or scale == 0.0:
        return "transparent"
    alpha = 0.12 + 0.78 * min(abs(credit) / scale, 1.0)
    return f"rgba(42,157,75,{alpha:.3f})" if credit > 0 else f"rgba(200,45,35,{alpha:.3f})"


def _token_span(token: dict[str, Any], scale: float) -> str:
    info = {"text": token["text"], "causal": token["causal"], "hindsight": token["hindsight"]}
    weight = "" if token["weight"] is None else repr(token["weight"])
    return (f'<span class="tok" style="background-color:{_shade(token["credit"], scale)}" '
            f'data-credit="{token["credit"]!r}" data-weight="{weight}" '
            f'data-info="{html.escape(json.dumps(info, ensure_ascii=False))}">{html.escape(token["text"])}</span>')


def _trajectory_html(index: int, view: dict[str, Any], scale: float) -> str:
    outcome = "success" if view["success"] else "failure"
    head = (f'<h2>#{index + 1} {html.escape(view["task_id"])} ({html.escape(view["task_type"] or view["env"])}): '
            f'{outcome}, reward {view["reward"]:g}, group {view["group"]}</h2>'
            f'<div class="label">verifier feedback</div><div class="text feedback">{html.escape(view["feedback"])}</div>')
    turns = []
    for t, turn in enumerate(view["turns"]):
        blocks = "".join(
            f'<details class="hindsight-block"><summary>hindsight block, tokens {s["start"]}-{s["end"]}</summary>'
            f'<div class="text">{html.escape(s["block"])}</div></details>'
            for s in view["segments"] if s["turn"] == t
        )
        credits = {token["credit"] for token in turn["tokens"]}
        advantage = f" (advantage {credits.pop():.4f} on every token)" if len(credits) == 1 and not blocks else ""
        action = html.escape(turn["action"]) + (" <b>(invalid)</b>" if turn["invalid"] else "")
        turns.append(
            f'<div class="turn"><div class="label">turn {t + 1}: observation</div>'
            f'<div class="text observation">{html.escape(turn["prompt"])}</div>'
            f'<div class="label">action tokens{advantage}</div>'
            f'<div class="tokens">{"".join(_token_span(token, scale) for token in turn["tokens"])}</div>'
            f'<div class="label">parsed action: {action}; step reward {turn["reward"]:g}</div>'
            + (f'<div class="label">env replied</div><div class="text reply">{html.escape(turn["observation"])}</div>'
               if turn["observation"] else "")
            + blocks + "</div>"
        )
    return f'<section class="trajectory {outcome}">{head}{"".join(turns)}</section>'


def render_page(run_name: str, step: int, views: list[dict[str, Any]]) -> str:
    """The HTML page of one step's credit views."""
    credits = [abs(token["credit"]) for view in views for turn in view["turns"] for token in turn["tokens"]]
    scale = max(credits, default=0.0)
    algo = views[0].get("algo", "?") if views else "?"
    legend = (f'<p class="legend">credit: <span style="background:{_shade(scale, scale)}">+{scale:.4f}</span>'
              f'<span style="background:{_shade(scale / 4, scale)}">+{scale / 4:.4f}</span>'
              f'<span style="background:{_shade(-scale / 4, scale)}">-{scale / 4:.4f}</span>'
              f'<span style="background:{_shade(-scale, scale)}">-{scale:.4f}</span> (hover or click a token)</p>')
    body = "".join(_trajectory_html(i, view, scale) for i, view in enumerate(views))
    title = f"{run_name}: credit at step {step}"
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)} ({html.escape(algo)}, "
            f"{len(views)} trajectories)</h1>{legend}{body}"
            f'<div id="panel"><p>Hover over an action token to see its credit, JSD weight and the top tokens of '
            f"both views.</p></div><script>{SCRIPT}</script></body></html>")


def write_page(run_dir: Path, step: int | None = None, out: Path | None = None) -> Path:
    """Write the page of ``step`` (default: the last step with views) to ``out`` (default:
    ``RUN/show/step_N.html``) atomically; returns its path."""
    chosen, views = load_views(run_dir, step)
    path = Path(out) if out is not None else Path(run_dir) / "show" / f"step_{chosen:06d}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_page(Path(run_dir).name, chosen, views))
    return path
