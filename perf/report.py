"""Human-readable output: the terminal metric table (gate tables and Markdown build on it)."""

from __future__ import annotations

from typing import Any


def format_value(value: float, unit: str) -> str:
    """A figure as a person reads it: 1.23 MiB, 4.56 ms, 0.53x, 12 syncs."""
    if unit in ("bytes", "bytes/sample"):
        v = abs(value)
        suffix = "/sample" if unit == "bytes/sample" else ""
        for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if v >= scale:
                return f"{value / scale:.2f} {name}{suffix}"
        return f"{value:.0f} B{suffix}"
    if unit == "s":
        if value >= 1:
            return f"{value:.3f} s"
        if value >= 1e-3:
            return f"{value * 1e3:.3f} ms"
        return f"{value * 1e6:.2f} us"
    if unit == "ratio":
        return f"{value:.3f}x"
    if unit in ("1", "r2"):
        return f"{value:.4g}"
    if float(value).is_integer():
        return f"{int(value)} {unit}"
    return f"{value:.4g} {unit}"


def metrics_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per metric: test id, metric name, value (with interval for ratios)."""
    rows: list[tuple[str, str, str]] = []
    for nodeid in sorted(results):
        for m in results[nodeid]["metrics"]:
            text = format_value(m["value"], m["unit"])
            if m.get("ci"):
                lo, hi = m["ci"]
                text += f" [{lo:.3f}, {hi:.3f}]"
            rows.append((nodeid, m["name"], text))
    if not rows:
        return []
    w0 = min(max(len(r[0]) for r in rows), 90)
    w1 = max(len(r[1]) for r in rows)
    return [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}" for r in rows]


# -- gate reports (perf.gate.GateResult) ---------------------------------------------------

_UPDATE_HINT = (
    "update the baseline: save a new run on the main branch "
    "(pytest --benchmark-autosave, or --benchmark-save=NAME)"
)


def _ratio_text(r: Any) -> str:
    if r.ratio is None:
        return "-"
    text = f"{r.ratio:.3f}x"
    if r.ci is not None:
        text += f" [{r.ci[0]:.3f}, {r.ci[1]:.3f}]"
    return text


def _margin_text(r: Any) -> str:
    if r.kind == "count":
        return "exact"
    if r.margin is None:
        return "-"
    return f"{r.margin:.0%}"


def _value_text(v: float | None, unit: str) -> str:
    return "-" if v is None else format_value(v, unit)


def _rows(results: list[Any]) -> list[tuple[str, ...]]:
    return [
        (
            r.nodeid,
            r.name,
            _value_text(r.old, r.unit),
            _value_text(r.new, r.unit),
            _ratio_text(r),
            _margin_text(r),
        )
        for r in results
    ]


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    widths[0] = min(widths[0], 80)
    fmt = indent + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*row).rstrip() for row in rows]


_HEADER = ("test", "metric", "baseline", "now", "ratio", "margin")


def gate_table(result: Any, verbose: bool = False) -> list[str]:
    """Terminal lines for a :class:`perf.gate.GateResult`: regressions first, then the rest.

    Each regression line names test, metric, old and new value, ratio and margin, so the
    failure is actionable from the CI log alone.
    """
    lines = [f"compared with {result.baseline}"]
    lines += [f"note: {n}" for n in result.notes]
    reg, imp, unch = result.regressions, result.improvements, result.unchanged
    if reg:
        lines.append(f"REGRESSIONS ({len(reg)}):")
        lines += _aligned(_HEADER, _rows(reg))
        for r in reg:
            if r.reason:
                lines.append(f"  {r.nodeid} {r.name}: {r.reason}")
    if imp:
        lines.append(f"improvements ({len(imp)}): {_UPDATE_HINT}")
        lines += _aligned(_HEADER, _rows(imp))
    if unch:
        lines.append(f"unchanged: {len(unch)} metrics")
        if verbose:
            lines += _aligned(_HEADER, _rows(unch))
    inc = result.by_status("inconclusive")
    if inc:
        lines.append(f"inconclusive ({len(inc)}): not failed, timings on a busy machine")
        lines += _aligned(_HEADER, _rows(inc))
        lines += [f"  {r.nodeid} {r.name}: {r.reason}" for r in inc]
    for status, title in (
        ("new", "new (not in baseline)"),
        ("missing", "missing (in baseline, not in this run)"),
    ):
        rs = result.by_status(status)
        if rs:
            lines.append(f"{title}: {len(rs)}")
            lines += [f"  {r.nodeid} {r.name}" + (f" ({r.reason})" if r.reason else "") for r in rs]
    refused = result.by_status("refused")
    if refused:
        lines.append(f"not compared: {len(refused)} metrics")
        reasons = sorted({r.reason for r in refused})
        lines += [f"  {why}" for why in reasons]
    verdict = "FAILED" if reg else "passed"
    lines.append(
        f"perf gate {verdict}: {len(reg)} regressions, {len(imp)} improvements, "
        f"{len(unch)} unchanged"
    )
    return lines


def _md_table(results: list[Any]) -> list[str]:
    out = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for row in _rows(results):
        cells = [f"`{row[0]}`", *row[1:]]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def gate_markdown(
    result: Any | None, *, saved: Any = None, missing: str | None = None, error: str | None = None
) -> str:
    """The gate as Markdown (``--perf-report``, GitHub job summary)."""
    out = ["## perf gate", ""]
    if error:
        out += [f"**Error:** {error}", "", "The baseline file was not modified.", ""]
    elif missing:
        out += [f"No baseline to compare with: {missing}", ""]
    if result is not None:
        reg, imp = result.regressions, result.improvements
        verdict = "❌ failed" if reg else "✅ passed"
        out += [
            f"{verdict}: {len(reg)} regressions, {len(imp)} improvements, "
            f"{len(result.unchanged)} unchanged (compared with `{result.baseline}`)",
            "",
        ]
        out += [f"> {n}" for n in result.notes]
        if result.notes:
            out.append("")
        if reg:
            out += ["### Regressions", "", *_md_table(reg), ""]
        if imp:
            out += ["### Improvements", "", f"_{_UPDATE_HINT}_", "", *_md_table(imp), ""]
        if result.unchanged:
            out += [
                "<details><summary>Unchanged</summary>",
                "",
                *_md_table(result.unchanged),
                "",
                "</details>",
                "",
            ]
        for status in ("inconclusive", "new", "missing", "refused"):
            rs = result.by_status(status)
            if rs:
                out += [f"### {status.capitalize()}", ""]
                out += [f"- `{r.nodeid}` {r.name}: {r.reason}" for r in rs]
                out.append("")
    if saved is not None:
        out += [f"Saved this run as `{saved}`.", ""]
    return "\n".join(out)
