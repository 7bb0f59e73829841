"""The compare page: one self-contained HTML file for a :class:`~softprobe.gym.evals.compare.Comparison`.

Built like the eval report (see :mod:`softprobe.gym.evals.report`): no network, no external
assets, every piece of agent text escaped, and a Content-Security-Policy that runs only the
page's own script (by hash), which only measures the plots. The plots are inline SVG.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from softprobe.gym.evals import plots
from softprobe.gym.evals.compare import Change, Comparison, Pair, StepDiff
from softprobe.gym.evals.report import PAGE_CSS, clip, escape

_CSS = PAGE_CSS + """
.delta-down{color:#b42318} .delta-up{color:#067647}
.side{display:grid;grid-template-columns:1fr 1fr;gap:12px} .side h4{margin:4px 0}
section{margin:18px 0} .sig{margin:2px 0}
"""
_LABELS: dict[Change, str] = {"regressed": "regressed", "score_down": "score down", "fixed": "fixed",
                              "score_up": "score up", "unchanged": "unchanged"}


def _verdict_cell(verdict: str, score: float | None) -> str:
    css = {"pass": "pass", "fail": "fail", "error": "error"}[verdict]
    shown = {"pass": "pass", "fail": "FAIL", "error": "ERROR"}[verdict]
    return f'<td class="{css}">{shown}</td><td>{"-" if score is None else f"{score:.3f}"}</td>'


def _delta(value: float | None, scale: float = 1.0, unit: str = "") -> str:
    if not value:  # None or no change
        return ""
    css = "delta-down" if value < 0 else "delta-up" if value > 0 else "muted"
    return f' <span class="{css}">({value * scale:+.3g}{unit})</span>'


def _rate(value: float) -> str:
    return f"{value * 100:.0f}%"


#: Fewer paired scores than this: the bootstrap interval is shown, but not judged.
MIN_PAIRS_FOR_INTERVAL = 10


def significance_lines(comparison: Comparison) -> list[str]:
    """The significance indications, as plain sentences (shared by the page and the terminal)."""
    m = comparison.mcnemar
    lines = [f"McNemar exact test on pass/fail: {m.b} passed in A only, {m.c} passed in B only, "
             f"p = {m.p_value:.4g}" + (" (a significant difference at 0.05)" if m.p_value < 0.05
                                       else " (no significant difference at 0.05)")]
    boot = comparison.bootstrap
    if boot is None:
        lines.append("Bootstrap interval of the mean score difference: no task has a score in both runs")
    else:
        # A percentile bootstrap of a handful of pairs (or of equal deltas) has no width to
        # judge by: say so rather than "excludes 0" next to a McNemar p of 1.
        if boot.n < MIN_PAIRS_FOR_INTERVAL or boot.low == boot.high:
            zero = f"too few paired scores ({boot.n}) to judge by this interval"
        else:
            zero = "excludes 0" if boot.low > 0 or boot.high < 0 else "includes 0"
        lines.append(f"Mean score difference B - A over {boot.n} tasks: {boot.mean_delta:+.3f}, "
                     f"{boot.level * 100:.0f}% bootstrap interval [{boot.low:+.3f}, {boot.high:+.3f}] "
                     f"({boot.resamples} paired resamples, seed {boot.seed}; {zero})")
    return lines


def gate_line(comparison: Comparison) -> str:
    """What the CI gate decided, and why."""
    n = comparison.gate_base or len(comparison.pairs)
    verdict = "FAILED" if comparison.gate_failed else "passed"
    share = comparison.newly_failing / n if n else 0.0
    lost = f" (missing from B: {', '.join(comparison.lost)})" if comparison.lost else ""
    return (f"gate {verdict}: {comparison.newly_failing} of {n} tasks ({share * 100:.3g}%) went from pass to "
            f"fail, error or missing{lost}; the threshold allows {comparison.threshold * 100:.3g}%")


def _step_box(step: dict[str, Any] | None) -> str:
    if step is None:
        return '<p class="muted">(no such step: the trajectory ended before it)</p>'
    action = step.get("action") or {}
    observation = step.get("observation")
    shown = observation if isinstance(observation, str) else json.dumps(observation, ensure_ascii=False, indent=1)
    error = step.get("error")
    return (
        f"<div class=\"muted\">action</div><pre>{escape(json.dumps(action, ensure_ascii=False))}</pre>"
        + (f'<div class="fail">{escape((error or {}).get("type", "error"))}: '
           f'{escape((error or {}).get("message", ""))}</div>' if error else "")
        + f'<div class="muted">observation</div><pre>{escape(clip(shown, 2000))}</pre>'
    )


def _first_diff(diff: StepDiff | None) -> str:
    if diff is None:
        return '<p class="muted">The trajectories are the same (only the grading differs).</p>'
    return (f'<p>First difference at step {diff.index}: <b>{escape(diff.field)}</b></p><div class="side">'
            f"<div><h4>A</h4>{_step_box(diff.a)}</div><div><h4>B</h4>{_step_box(diff.b)}</div></div>")


def _pair_details(pair: Pair) -> str:
    spark = plots.sparkline([pair.a.rewards, pair.b.rewards], names=["A", "B"], width=220, height=40,
                            label=f"reward per step of {pair.id}: A solid, B dashed")
    return (
        f'<details open class="pair" data-task="{escape(pair.id)}"><summary>{escape(pair.id)} — '
        f'{escape(_LABELS[pair.change])}: A {escape(pair.a.verdict)} '
        f'{"-" if pair.a.score is None else f"{pair.a.score:.3f}"} → B {escape(pair.b.verdict)} '
        f'{"-" if pair.b.score is None else f"{pair.b.score:.3f}"}</summary>'
        f'<div class="side"><div><div class="muted">A: {escape(pair.a.reason)}</div></div>'
        f'<div><div class="muted">B: {escape(pair.b.reason)}</div></div></div>'
        f'<div class="muted">reward per step (A solid, B dashed)</div>{spark}'
        f"{_first_diff(pair.first_diff)}</details>"
    )


def _table(pairs: list[Pair]) -> str:
    rows = "".join(
        f'<tr data-task="{escape(p.id)}"><td>{escape(p.id)}</td>'
        f"{_verdict_cell(p.a.verdict, p.a.score)}{_verdict_cell(p.b.verdict, p.b.score)}"
        f"<td>{escape(_LABELS[p.change])}{_delta(p.score_delta)}</td>"
        f"<td>{plots.sparkline([p.a.rewards, p.b.rewards], names=['A', 'B'], label=f'reward per step of {p.id}')}"
        "</td></tr>"
        for p in pairs
    )
    return ("<table><thead><tr><th>task</th><th>A</th><th>A score</th><th>B</th><th>B score</th>"
            f"<th>change</th><th>reward per step</th></tr></thead><tbody>{rows}</tbody></table>")


def _section(key: str, title: str, pairs: list[Pair], detailed: bool) -> str:
    if not pairs:
        return f'<section id="{key}"><h2>{title} (0)</h2><p class="muted">none</p></section>'
    body = _table(pairs) + ("".join(_pair_details(p) for p in pairs) if detailed else "")
    return f'<section id="{key}"><h2>{title} ({len(pairs)})</h2>{body}</section>'


def render_compare(comparison: Comparison) -> str:
    """The compare page as one HTML string."""
    script = plots.MEASURE_JS
    script_hash = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    # form-action and base-uri do not fall back to default-src: closed explicitly.
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    c = comparison
    mean_delta = (c.mean_score_b - c.mean_score_a
                  if c.mean_score_a is not None and c.mean_score_b is not None else None)

    def mean(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    cards = [
        ("paired tasks", str(len(c.pairs)), ""),
        ("pass rate A → B", f"{_rate(c.pass_rate_a)} → {_rate(c.pass_rate_b)}",
         _delta(c.pass_rate_b - c.pass_rate_a, 100, " pts")),
        ("mean score A → B", f"{mean(c.mean_score_a)} → {mean(c.mean_score_b)}", _delta(mean_delta)),
        ("regressions", str(len(c.by_change("regressed", "score_down"))), ""),
        ("fixes", str(len(c.by_change("fixed", "score_up"))), ""),
        ("gate", "FAILED" if c.gate_failed else "passed", ""),
    ]
    card_html = "".join(f'<div class="card"><b>{escape(v)}{d}</b><span class="muted">{escape(k)}</span></div>'
                        for k, v, d in cards)
    sig = "".join(f'<p class="sig">{escape(line)}</p>' for line in significance_lines(c))
    hist = plots.histogram([("A", [p.a.score for p in c.pairs]), ("B", [p.b.score for p in c.pairs])],
                           label="score distribution of A and B")
    unpaired = "".join(
        f'<p id="only-{side.lower()}">Only in {side} (not paired): {escape(", ".join(ids))}</p>'
        for side, ids in (("A", c.only_a), ("B", c.only_b)) if ids
    )
    title = f"{c.a.name} vs {c.b.name}" if c.a.name != c.b.name else c.a.name
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>compare: {escape(title)} — softprobe-gym</title><style>{_CSS}</style></head><body>"
        f"<h1>Compare: {escape(title)}</h1>"
        f'<div class="muted">A = {escape(c.a.path)} ({escape(c.a.kind)}) · B = {escape(c.b.path)} '
        f"({escape(c.b.kind)})</div>"
        f'<div class="cards">{card_html}</div><div id="significance">{sig}'
        f'<p class="sig"><b>{escape(gate_line(c))}</b></p></div>'
        f'<div class="plots"><div><div class="muted">score distribution (paired tasks)</div>{hist}</div></div>'
        + unpaired
        + _section("regressions", "Regressions", c.by_change("regressed", "score_down"), True)
        + _section("fixes", "Fixes", c.by_change("fixed", "score_up"), True)
        + _section("unchanged", "Unchanged", c.by_change("unchanged"), False)
        + f"<script>{script}</script></body></html>"
    )


def write_compare(path: Path, comparison: Comparison) -> None:
    """Write the compare page to ``path``.

    Raises:
        OSError: it cannot be written.
    """
    path.write_text(render_compare(comparison), encoding="utf-8")
