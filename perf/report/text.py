"""Human-readable output: the terminal metric table (gate tables and Markdown build on it).

Test ids, metric names, run names and fingerprint fields come from stored runs, i.e. from CI
caches and artifacts, so they are untrusted. Each sink gets one escaping function applied
where text leaves perf: :func:`terminal_line` for every line printed (terminal, CI log,
``python -m perf``), :func:`md_code` / :func:`md_text` for every untrusted field of the
Markdown report and the GitHub step summary.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any


def _escape_char(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _unsafe(c: str) -> bool:
    # Cc: C0/C1 controls (ESC starts ANSI sequences, CR rewrites the line, LF fakes lines);
    # Cf: format characters (bidi overrides reorder what is shown); Zl/Zp: line breaks.
    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def plain(text: str) -> str:
    """``text`` with every control / format character shown as a visible escape (\\x1b)."""
    return "".join(_escape_char(c) if _unsafe(c) else c for c in text)


_WORKFLOW_COMMAND = re.compile(r"^(\s*):(?=:)")


def terminal_line(line: str) -> str:
    """A line safe to print to a terminal or a CI log.

    Control characters become visible escapes, so untrusted text cannot move the cursor,
    recolour, clear the screen or start a new line; a line that would start with ``::``
    (a GitHub Actions workflow command such as ``::add-mask::``) gets its first colon shown
    as ``\\x3a``.
    """
    return _WORKFLOW_COMMAND.sub(lambda m: m.group(1) + "\\x3a", plain(line))


_MD_SPECIAL = re.compile(r"([\\`*_\[\]()<>&|!~:$#])")


def md_text(text: str) -> str:
    """Untrusted text for Markdown prose: every character that could start a link, image,
    HTML tag, emphasis, table cell, autolink or math is backslash-escaped (CommonMark shows
    an escaped ASCII punctuation character literally)."""
    return _MD_SPECIAL.sub(r"\\\1", plain(text))


def md_code(text: str, *, in_table: bool = False) -> str:
    """Untrusted text as a Markdown code span: shown literally, nothing inside is parsed.

    The fence is one backtick longer than the longest run inside, so no content can close
    it; in a table ``|`` is escaped (GFM splits cells before parsing spans).
    """
    t = plain(text)
    longest = max((len(m) for m in re.findall(r"`+", t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or not t.strip() else ""
    out = f"{fence}{pad}{t}{pad}{fence}"
    return out.replace("|", "\\|") if in_table else out


def format_value(value: float, unit: str) -> str:
    """A figure as a person reads it: 1.23 MiB, 4.56 ms, 0.53x, 12 syncs."""
    if unit in ("bytes", "bytes/sample"):
        v = abs(value)
        suffix = "/sample" if unit == "bytes/sample" else ""
        for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if v >= scale:
                return f"{value / scale:.2f} {name}{suffix}"
        return f"{value:.0f} B{suffix}"
    if unit in ("s", "compile_s"):
        if value >= 1:
            return f"{value:.3f} s"
        if value >= 1e-3:
            return f"{value * 1e3:.3f} ms"
        return f"{value * 1e6:.2f} us"
    if unit == "modelled_s":
        return format_value(value, "s") + " (modelled)"
    if unit == "ratio":
        return f"{value:.3f}x"
    if unit in ("1", "r2"):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value} {unit}"  # exact, also above 2**53
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
                lo, hi = sorted(m["ci"])
                text += f" [{lo:.3f}, {hi:.3f}]"
            rows.append((nodeid, m["name"], text))
    if not rows:
        return []
    w0 = min(max(len(r[0]) for r in rows), 90)
    w1 = max(len(r[1]) for r in rows)
    return [terminal_line(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}") for r in rows]


# -- gate reports (perf.gate.verdict.GateResult) ---------------------------------------------------

_UPDATE_HINT = (
    "update the baseline: save a new run on the main branch "
    "(pytest --benchmark-autosave, or --benchmark-save=NAME)"
)


def _ratio_text(r: Any) -> str:
    if r.ratio is None:
        return "-"
    if r.ratio == float("inf"):
        return "from 0"  # a count or size that was 0: no ratio to speak of
    text = f"{r.ratio:.3f}x"
    if r.ci is not None:
        lo, hi = sorted(r.ci)  # always low first
        text += f" [{lo:.3f}, {hi:.3f}]"
    return text


def _interleaved_text(r: Any) -> str:
    ci = getattr(r, "interleaved_ci", None)
    if ci is None:
        return "-"
    lo, hi = sorted(ci)
    return f"[{lo:.3f}, {hi:.3f}]"


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
#: The UNDECIDED section shows both intervals: the stored comparison's (beside its ratio,
#: new/old) and the interleaved one (head/base, lower is better) where one was measured.
_UNDECIDED_HEADER = (*_HEADER, "interleaved head/base")
_UNDECIDED_TITLE = (
    "neither a regression nor unchanged: an interval leaves the margin without clearing it, "
    "or the machine could not tell; ini perf_undecided = warn | fail decides the exit status"
)


def _undecided_rows(results: list[Any]) -> list[tuple[str, ...]]:
    return [(*row, _interleaved_text(r)) for row, r in zip(_rows(results), results, strict=True)]


def undecided_annotation(result: Any) -> str:
    """A GitHub Actions ``::warning`` line naming the undecided timings ('' when none);
    untrusted names escaped by :func:`annotation`."""
    und = result.undecided
    if not und:
        return ""
    names = ", ".join(f"{r.nodeid} {r.name}" for r in und[:5])
    more = f" and {len(und) - 5} more" if len(und) > 5 else ""
    return annotation(
        "warning", "perf gate", f"perf gate: {len(und)} timing(s) UNDECIDED: {names}{more}"
    )


def gate_table(result: Any, verbose: bool = False) -> list[str]:
    """Terminal lines for a :class:`perf.gate.verdict.GateResult`: regressions first, then the rest.

    Each regression line names test, metric, old and new value, ratio and margin, so the
    failure is actionable from the CI log alone. Every line is passed through
    :func:`terminal_line`.
    """
    return [terminal_line(line) for line in _gate_lines(result, verbose)]


def _gate_lines(result: Any, verbose: bool) -> list[str]:
    lines = [f"compared with {result.baseline}"]
    lines += [f"note: {n}" for n in result.notes]
    reg, imp, unch = result.regressions, result.improvements, result.unchanged
    if reg:
        lines.append(f"REGRESSIONS ({len(reg)}):")
        lines += _aligned(_HEADER, _rows(reg))
        for r in reg:
            if r.explanation:
                lines.append(f"  {r.nodeid} {r.name}: {r.explanation}")
    if imp:
        lines.append(f"improvements ({len(imp)}): {_UPDATE_HINT}")
        lines += _aligned(_HEADER, _rows(imp))
        lines += [f"  {r.nodeid} {r.name}: {r.sites}" for r in imp if getattr(r, "sites", "")]
    if unch:
        lines.append(f"unchanged: {len(unch)} metrics")
        if verbose:
            lines += _aligned(_HEADER, _rows(unch))
            lines += [f"  {r.nodeid} {r.name}: {r.explanation}" for r in unch if r.explanation]
    und = result.undecided
    if und:
        lines.append(f"UNDECIDED ({len(und)}): {_UNDECIDED_TITLE}")
        lines += _aligned(_UNDECIDED_HEADER, _undecided_rows(und))
        lines += [f"  {r.nodeid} {r.name}: {r.explanation}" for r in und]
    for status, title in (
        ("new", "new (not in baseline)"),
        ("missing", "missing (in baseline, not in this run)"),
    ):
        rs = result.by_status(status)
        if rs:
            lines.append(f"{title}: {len(rs)}")
            lines += [
                f"  {r.nodeid} {r.name}" + (f" ({r.explanation})" if r.explanation else "")
                for r in rs
            ]
    refused = result.by_status("refused")
    if refused:
        lines.append(f"not compared: {len(refused)} metrics")
        reasons = sorted({r.explanation for r in refused})
        lines += [f"  {why}" for why in reasons]
    verdict = "FAILED" if reg else "passed"
    lines.append(
        f"perf gate {verdict}: {len(reg)} regressions, {len(imp)} improvements, "
        f"{len(unch)} unchanged" + (f", {len(und)} undecided" if und else "")
    )
    return lines


def _md_table(results: list[Any], *, undecided: bool = False) -> list[str]:
    header = _UNDECIDED_HEADER if undecided else _HEADER
    rows = _undecided_rows(results) if undecided else _rows(results)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [md_code(row[0], in_table=True), md_code(row[1], in_table=True)]
        cells += [md_text(c) for c in row[2:]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _md_notes(notes: list[tuple[Any, str]]) -> list[str]:
    """A list item per result with something to say (the sites behind a count change)."""
    items = [
        f"- {md_code(r.nodeid)} {md_code(r.name)}: {md_text(text)}" for r, text in notes if text
    ]
    return [*items, ""] if items else []


def gate_markdown(
    result: Any | None,
    *,
    saved: Any = None,
    missing: str | None = None,
    error: str | None = None,
    problems: tuple[str, ...] = (),
) -> str:
    """The gate as Markdown (``--perf-report``, GitHub job summary)."""
    out = ["## perf gate", ""]
    if error:
        out += [f"**Error:** {md_text(error)}", "", "The baseline file was not modified.", ""]
    elif missing:
        out += [f"No baseline to compare with: {md_text(missing)}", ""]
    if result is not None:
        reg, imp = result.regressions, result.improvements
        und = result.undecided
        verdict = "❌ failed" if reg else "⚠️ passed, undecided" if und else "✅ passed"
        out += [
            f"{verdict}: {len(reg)} regressions, {len(imp)} improvements, "
            f"{len(result.unchanged)} unchanged"
            + (f", {len(und)} undecided" if und else "")
            + f" (compared with {md_code(result.baseline)})",
            "",
        ]
        out += [f"> {md_text(n)}" for n in result.notes]
        if result.notes:
            out.append("")
        if reg:
            out += ["### Regressions", "", *_md_table(reg), ""]
            out += _md_notes([(r, getattr(r, "sites", "")) for r in reg])
        if imp:
            out += ["### Improvements", "", f"_{_UPDATE_HINT}_", "", *_md_table(imp), ""]
            out += _md_notes([(r, getattr(r, "sites", "")) for r in imp])
        if und:
            out += ["### UNDECIDED", "", md_text(_UNDECIDED_TITLE), ""]
            out += [*_md_table(und, undecided=True), ""]
            out += _md_notes([(r, r.explanation) for r in und])
        if result.unchanged:
            out += [
                "<details><summary>Unchanged</summary>",
                "",
                *_md_table(result.unchanged),
                "",
                "</details>",
                "",
            ]
        for status in ("new", "missing", "refused"):
            rs = result.by_status(status)
            if rs:
                out += [f"### {status.capitalize()}", ""]
                out += [
                    f"- {md_code(r.nodeid)} {md_code(r.name)}: {md_text(r.explanation)}" for r in rs
                ]
                out.append("")
    if saved is not None:
        out += [f"Saved this run as {md_code(str(saved))}.", ""]
    for problem in problems:
        out += [f"**Not written:** {md_text(problem)}", ""]
    return "\n".join(out)


def annotation(
    level: str, title: str, message: str, *, file: str | None = None, line: int | None = None
) -> str:
    """A GitHub Actions workflow command (``::error file=...,line=...,title=...::message``)
    whose untrusted parts cannot end it early or start another: GitHub's own escapes (``%``,
    CR, LF in the message; also ``:`` and ``,`` in the properties), after :func:`plain`.
    ``file`` (relative to ``GITHUB_WORKSPACE``) and ``line`` pin it to a line of the diff."""
    if level not in ("error", "warning", "notice"):
        raise ValueError(f"annotation level {level!r}: error, warning or notice")

    def data(s: str) -> str:
        return plain(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(s: str) -> str:
        return data(s).replace(":", "%3A").replace(",", "%2C")

    where = f"file={prop(file)}," if file else ""
    where += f"line={int(line)}," if file and line is not None else ""
    return f"::{level} {where}title={prop(title)}::{data(message)}"
