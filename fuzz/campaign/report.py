"""Campaign reports: a summary table, Markdown, and a self-contained HTML page.

The HTML page draws its plots as inline SVG, so it needs no network, no
JavaScript and no plotting library.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.totals import Totals, is_missed_hit

__all__ = ["schedule_table", "startup_line", "summary_table", "write_reports"]


def _aligned(rows: list[tuple[str, ...]]) -> str:
    """Rows as a plain-text table, the first a header underlined with dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_table(total: Totals, elapsed: float) -> str:
    """One row per target: examples, examples per second of the time it ran,
    when its first example ran (seconds after the run started), violations,
    missed hits (counted apart: a performance bug, not a corruption)."""
    rows = [("target", "examples", "examples/s", "first example", "violations", "missed hits")]
    fails: dict[str, set[str]] = {}
    missed: dict[str, set[str]] = {}
    for f in total.failures:
        for name in f.get("targets") or [f["target"]]:
            (missed if is_missed_hit(f) else fails).setdefault(name, set()).add(f["key"])
    for name in sorted(set(total.examples) | set(fails) | set(missed)):
        n = total.examples.get(name, 0)
        secs = total.seconds.get(name) or elapsed
        first = total.first_example_s.get(name)
        rows.append((name, str(n), f"{n / max(secs, 1e-9):.1f}", "-" if first is None else f"{first:.1f}s",
                     str(len(fails.get(name, ()))), str(len(missed.get(name, ())))))
    return _aligned(rows)


def schedule_table(total: Totals) -> str:
    """One row per target, over every worker's slices
    (:mod:`fuzz.campaign.schedule`): its share of the fuzzing time, its
    slices by why each was given (its first, its floor, the best discovery
    rate), and the new behaviours it found (:mod:`fuzz.campaign.novelty`)."""
    per: dict[str, dict[str, float]] = {}
    for slices in total.slices.values():
        for target, why, seconds, _examples, novelty in slices:
            row = per.setdefault(target, {"seconds": 0.0, "first": 0, "floor": 0, "best": 0, "new": 0})
            row["seconds"] += seconds
            row["new"] += novelty
            row["best" if why.startswith("best") else "floor" if why == "floor" else "first"] += 1
    if not per:
        return "(no slices recorded)"
    spent = sum(r["seconds"] for r in per.values()) or 1e-9
    rows = [("target", "share", "seconds", "first", "floor", "best rate", "new behaviours")]
    for name, r in sorted(per.items(), key=lambda kv: -kv[1]["seconds"]):
        rows.append((name, f"{100 * r['seconds'] / spent:.0f}%", f"{r['seconds']:.1f}", str(int(r["first"])),
                     str(int(r["floor"])), str(int(r["best"])), str(int(r["new"]))))
    return _aligned(rows)


def startup_line(total: Totals) -> str:
    """When the workers were ready to fuzz (their start-up, mostly importing vLLM)."""
    if not total.startup_s:
        return "start-up: no worker reported"
    ready = sorted(total.startup_s)
    median = ready[len(ready) // 2]
    spread = f" (first {ready[0]:.1f}s, last {ready[-1]:.1f}s)" if len(ready) > 1 else ""
    return f"start-up: workers ready to fuzz {median:.1f}s after the run started{spread}, {len(ready)} worker(s)"


def _md_counter(title: str, counter: dict[str, int], limit: int = 30, per: int | None = None) -> list[str]:
    """A count table; shares are of ``per`` (e.g. examples) when given, else of the total."""
    if not counter:
        return [f"### {title}", "", "(none)", ""]
    total = per or sum(counter.values())
    out = [f"### {title}", "", "| value | count | share |", "|---|---:|---:|"]
    for k, v in sorted(counter.items(), key=lambda kv: -kv[1])[:limit]:
        out.append(f"| {k} | {v} | {100 * v / total:.1f}% |")
    return out + [""]


def _svg_bars(title: str, counter: dict[str, int], *, numeric_keys: bool = False) -> str:
    if not counter:
        return f"<p>{html.escape(title)}: no data</p>"
    items = sorted(counter.items(), key=(lambda kv: int(kv[0])) if numeric_keys else (lambda kv: -kv[1]))[:25]
    width, bar_h, label_w = 760, 18, 330
    height = 30 + bar_h * len(items)
    peak = max(v for _, v in items)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, (label, value) in enumerate(items):
        y = 26 + i * bar_h
        w = (width - label_w - 60) * value / peak
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" font-size="12" text-anchor="end">{html.escape(str(label)[:48])}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{bar_h - 4}" fill="#4c78a8"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" font-size="12">{value}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_reports(
    total: Totals, report_dir: Path, *, repro_dir: Path, elapsed: float, config: CampaignConfig,
    sections: tuple[tuple[list[str], str], ...] = (),
) -> tuple[Path, Path]:
    """``sections``: more (Markdown lines, HTML) to add, e.g. vLLM code coverage (fuzz.coverage)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    tel = total.telemetry
    n = total.example_count
    header = [
        "# Fuzz campaign report",
        "",
        f"- vLLM {total.vllm_version}; targets: {', '.join(config.targets)}",
        f"- budget {config.budget:.0f}s, wall {elapsed:.1f}s, workers {config.slots}, seed {config.seed}",
        f"- examples: {n} ({n / max(elapsed, 1e-9):.1f}/s)",
        f"- planted bug: {config.plant or 'none (unmodified vLLM)'}",
        f"- {startup_line(total)}",
        "",
        "## Summary",
        "",
        "```",
        summary_table(total, elapsed),
        "```",
        "",
        "## Schedule",
        "",
        "Slices by why each target got them: its first slice, its floor (half an even share of the time so far), "
        "or the best recent rate of new behaviour (new branch labels, known-bug states, refusals, hit gaps; "
        "fuzz/campaign/schedule.py).",
        "",
        "```",
        schedule_table(total),
        "```",
        "",
    ]
    failures = {f["key"]: f for f in total.failures if not is_missed_hit(f)}
    missed = {f["key"]: f for f in total.failures if is_missed_hit(f)}
    for title, found in (("Violations", failures), ("Missed hits (performance, not corruption)", missed)):
        header += [f"## {title}", ""]
        if not found:
            header.append("None.")
        for f in found.values():
            repro = f.get("repro")
            link = f"[{repro}]({Path(repro_dir, repro).resolve().as_uri()})" if repro else "(no repro file: the sidecar keeps the run)"
            first = f["violation"].splitlines()[0] if f["violation"] else ""
            known = f" (known vLLM bug `{f['known_bug']}`, fuzz/known_bugs.py)" if f.get("known_bug") else ""
            targets = ", ".join(f"`{t}`" for t in f.get("targets") or [f["target"]])
            header += [
                f"- **{f['invariant']}**{known} in {targets} at `{f['key'].split('|', 1)[1]}` after {f['found_after_s']}s: {first}",
                f"  - repro: {link}; replay: `python -m fuzz replay {Path(repro_dir, repro or '')}`",
            ]
        header.append("")
    header += ["## Known vLLM bugs met and set aside", ""]
    set_aside = tel.get("known_bugs", {})
    header += [f"- `{bug_id}`: {n} step(s) (fuzz/known_bugs.py)" for bug_id, n in sorted(set_aside.items())] or ["None."]
    if total.unsupported:
        header += ["", "## Unsupported targets (skipped)", ""]
        header += [f"- `{name}`: {why}" for name, why in sorted(total.unsupported.items())]
    md = header + ["", "## Coverage", ""]
    md += _md_counter("Branches reached (share of all examples)", tel.get("branches", {}), per=n or None)
    md += _md_counter("Spec types drawn (per group)", tel.get("spec_kinds", {}))
    md += _md_counter("Group layouts drawn", tel.get("layouts", {}), limit=20)
    md += _md_counter("Per-group hit gap (max - min, in scheduler blocks)", tel.get("hit_gap", {}))
    md += _md_counter("Configurations rejected by vLLM", tel.get("rejections", {}))
    for more_md, _ in sections:
        md += [""] + more_md
    md_path = report_dir / "report.md"
    md_path.write_text("\n".join(md) + "\n")

    body = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Fuzz campaign report</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:2em auto}pre{background:#f4f4f4;padding:1em}</style>",
        "</head><body>",
        "<h1>Fuzz campaign report</h1>",
        "<pre>" + html.escape("\n".join(header[2:7])) + "</pre>",
        "<h2>Summary</h2><pre>" + html.escape(summary_table(total, elapsed)) + "</pre>",
        "<h2>Schedule</h2><pre>" + html.escape(schedule_table(total)) + "</pre>",
    ]
    for title, found in (("Violations", failures), ("Missed hits (performance, not corruption)", missed)):
        body.append(f"<h2>{html.escape(title)}</h2>")
        if not found:
            body.append("<p>None.</p>")
            continue
        body.append("<ul>")
        for f in found.values():
            repro = f.get("repro")
            link = f"<a href='{html.escape(Path(repro_dir, repro).resolve().as_uri())}'>{html.escape(repro)}</a>" if repro else "no repro"
            targets = ", ".join(f.get("targets") or [f["target"]])
            body.append(f"<li><b>{html.escape(f['invariant'])}</b> in {html.escape(targets)} "
                        f"at <code>{html.escape(f['key'].split('|', 1)[1])}</code>: {link}</li>")
        body.append("</ul>")
    body.append("<h2>Coverage</h2>")
    body.append(_svg_bars("Per-group hit gap (scheduler blocks)", tel.get("hit_gap", {}), numeric_keys=True))
    body.append(_svg_bars("Branches reached", tel.get("branches", {})))
    body.append(_svg_bars("Spec types drawn", tel.get("spec_kinds", {})))
    body.append(_svg_bars("Group layouts drawn", tel.get("layouts", {})))
    body.append(_svg_bars("Rejected configurations", tel.get("rejections", {})))
    body += [more_html for _, more_html in sections]
    body.append("<h2>Raw data</h2><pre>" + html.escape(json.dumps(tel, indent=1, sort_keys=True)[:20000]) + "</pre>")
    body.append("</body></html>")
    html_path = report_dir / "report.html"
    html_path.write_text("\n".join(body))
    return md_path, html_path
