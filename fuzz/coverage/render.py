"""How ``python -m fuzz run --coverage`` shows what it measured: the
report's markdown section, the growth table and its SVG plot, the tracing
overhead line, and the side-by-side comparison with vLLM's own tests
(``python -m fuzz.coverage compare``). :mod:`fuzz.coverage` measures; this
module only renders."""

from __future__ import annotations

import html
from typing import Any

from fuzz.coverage.summary import Summary

__all__ = ["compare", "growth_table", "markdown", "overhead_line", "svg_growth"]


def _pct(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.0f}%"


def markdown(summary: Summary, *, missing_limit: int = 200) -> list[str]:
    """The report's section: per file, per function, growth table, never-taken branches."""
    out = [f"## vLLM code coverage (coverage.py, line + branch; vLLM {summary.vllm_version})", "",
           "| file | lines | branches |", "|---|---:|---:|"]
    for module, f in summary.files.items():
        out.append(f"| `{module.removeprefix('vllm/v1/core/')}` | {f['lines_covered']}/{f['lines']} "
                   f"({_pct(f['lines_covered'], f['lines'])}) | {f['branches_covered']}/{f['branches']} "
                   f"({_pct(f['branches_covered'], f['branches'])}) |")
    out += ["", "### Branches per function", "", "| function | lines covered | branches covered |", "|---|---:|---:|"]
    for row in summary.functions:
        out.append(f"| `{row['function']}` | {row['statements_covered']}/{row['statements']} "
                   f"| {row['covered']}/{row['branches']} ({_pct(row['covered'], row['branches'])}) |")
    if summary.growth:
        out += ["", "### Covered branches over time (seconds since the campaign started)", ""]
        out += growth_table(summary.growth)
    out += ["", "### Branches never taken in those functions", ""]
    shown = 0
    for row in summary.functions:
        for m in row["missing"]:
            if shown >= missing_limit:
                break
            dest = "exit" if m["to"] < 0 else f"line {m['to']}"
            out.append(f"- `{row['function']}` {row['module'].removeprefix('vllm/v1/core/')}:{m['from']} "
                       f"`{m['source'][:90]}` -> {dest}")
            shown += 1
    total = sum(len(r["missing"]) for r in summary.functions)
    if total > shown:
        out.append(f"- ... and {total - shown} more (coverage-summary.json)")
    if not total:
        out.append("None.")
    return out + [f"- note: {n}" for n in summary.notes] + [""]


def growth_table(growth: dict[str, list[tuple[float, int]]], points: int = 8) -> list[str]:
    """Covered branches per target at a few moments (the last point at the end)."""
    end = max((p[-1][0] for p in growth.values() if p), default=0.0)
    moments = sorted({round(end * (i + 1) / points, 1) for i in range(points)})
    out = ["| target | " + " | ".join(f"{m:.0f}s" for m in moments) + " |",
           "|---|" + "---:|" * len(moments)]
    for target, series in sorted(growth.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        cells = []
        for m in moments:
            at = [c for t, c in series if t <= m + 1e-9]
            cells.append(str(at[-1]) if at else "0")
        out.append(f"| {target} | " + " | ".join(cells) + " |")
    return out


_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d", "#000000")


def svg_growth(growth: dict[str, list[tuple[float, int]]], title: str = "vLLM branches covered over time") -> str:
    """A step plot, one line per target (inline SVG, no plotting library)."""
    if not growth:
        return f"<p>{html.escape(title)}: no data</p>"
    width, height, left, bottom, top = 760, 320, 60, 40, 30
    t_max = max(max(t for t, _ in s) for s in growth.values()) or 1.0
    c_max = max(max(c for _, c in s) for s in growth.values()) or 1
    def x(t: float) -> float:
        return left + (width - left - 170) * t / t_max

    def y(c: float) -> float:
        return height - bottom - (height - bottom - top) * c / c_max

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{y(0)}" x2="{x(t_max)}" y2="{y(0)}" stroke="#888"/>',
             f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{y(c_max)}" stroke="#888"/>',
             f'<text x="{left}" y="{height - 10}" font-size="11">0 s</text>',
             f'<text x="{x(t_max)}" y="{height - 10}" font-size="11" text-anchor="end">{t_max:.0f} s</text>',
             f'<text x="{left - 4}" y="{y(c_max) + 4}" font-size="11" text-anchor="end">{c_max}</text>',
             f'<text x="{left - 4}" y="{y(0) + 4}" font-size="11" text-anchor="end">0</text>']
    for i, (target, series) in enumerate(sorted(growth.items(), key=lambda kv: (kv[0] == "all", kv[0]))):
        colour = _COLOURS[i % len(_COLOURS)]
        pts, last = [f"{x(0):.1f},{y(0):.1f}"], 0
        for t, c in series:
            pts += [f"{x(t):.1f},{y(last):.1f}", f"{x(t):.1f},{y(c):.1f}"]
            last = c
        pts.append(f"{x(t_max):.1f},{y(last):.1f}")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(pts)}"/>')
        parts.append(f'<text x="{width - 165}" y="{top + 14 * i + 10}" font-size="11" fill="{colour}">'
                     f'{html.escape(target)} ({last})</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def overhead_line(traced: tuple[int, float], untraced: tuple[int, float] | None) -> str:
    """Examples per second of fuzzing time with the tracer, and without (from
    the last untraced campaign of the same targets in the same report
    directory, when there is one)."""
    n, secs = traced
    rate = n / max(secs, 1e-9)
    if untraced is None:
        return (f"coverage: {rate:.1f} examples/s traced; run the same command without --coverage "
                "into the same --report-dir first to print the overhead")
    m, secs0 = untraced
    base = m / max(secs0, 1e-9)
    return (f"coverage overhead: {rate:.1f} examples/s traced vs {base:.1f} in the last untraced run here "
            f"({100 * (1 - rate / max(base, 1e-9)):+.0f}% fewer; two runs see different machine load: "
            "`python -m fuzz.coverage overhead` alternates both in one process)")


def compare(ours: dict[str, Any], theirs: dict[str, Any], *, ours_name: str = "campaign",
            theirs_name: str = "vLLM tests") -> list[str]:
    """Per function, side by side: branches each side covers, and the branches
    ``theirs`` takes that ``ours`` never does (with their source lines). Both
    summaries (``coverage-summary.json``) must come from the same vLLM source."""
    out = [f"| function | {ours_name} | {theirs_name} | only {theirs_name} | only {ours_name} |",
           "|---|---:|---:|---:|---:|"]
    gaps: list[str] = []
    theirs_rows = {(r["module"], r["function"]): r for r in theirs["functions"]}
    for row in ours["functions"]:
        other = theirs_rows.get((row["module"], row["function"]))
        if other is None or (row["branches"] == 0 and other["branches"] == 0):
            continue
        mine = {(m["from"], m["to"]) for m in row["missing"]}
        their_missing = {(m["from"], m["to"]): m for m in other["missing"]}
        only_theirs = sorted(mine - set(their_missing))
        only_ours = sorted(set(their_missing) - mine)
        out.append(f"| `{row['function']}` | {row['covered']}/{row['branches']} | {other['covered']}/{other['branches']} "
                   f"| {len(only_theirs)} | {len(only_ours)} |")
        by_arc = {(m["from"], m["to"]): m for m in row["missing"]}
        for arc in only_theirs:
            m = by_arc[arc]
            dest = "exit" if arc[1] < 0 else f"line {arc[1]}"
            gaps.append(f"- `{row['function']}` {row['module'].removeprefix('vllm/v1/core/')}:{arc[0]} "
                        f"`{m['source'][:90]}` -> {dest}")
    files = [f"| `{m.removeprefix('vllm/v1/core/')}` | {f['branches_covered']}/{f['branches']} | "
             f"{theirs['files'].get(m, {}).get('branches_covered', '-')}/{theirs['files'].get(m, {}).get('branches', '-')} |"
             for m, f in ours["files"].items()]
    return ([f"| file | {ours_name} branches | {theirs_name} branches |", "|---|---:|---:|", *files, "", *out, "",
             f"Branches {theirs_name} take and the {ours_name} never does:", "", *(gaps or ["None."])])
