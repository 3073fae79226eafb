"""The metric record: one named figure of one test, with the unit that decides how it is gated.

A metric travels from a test (``perf_metrics.record``) through the pytest report (as a plain
dict, so it survives xdist) to the terminal summary and the baseline store. Its *kind* is
derived from its unit and decides the comparison policy (design.md, "Metrics model"):

- ``count``: exact; any increase is a regression.
- ``bytes``: relative tolerance.
- ``time`` / ``ratio``: statistical, only against a run with the same machine fingerprint.
- ``compile``: compile time, one value per run, compared only between runs whose Inductor
  cache was in the same state (cold or warm); never a timing of the re-measuring gates.
- ``modelled``: a modelled GPU time (``perf.model_gpu_time`` on a named GPU, unit
  ``modelled_s``): deterministic like a count, compared with a small relative tolerance on any
  machine; never a measurement.
- ``info``: recorded for trend plots and reports, never gated (sizes, fits, R²).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["count", "bytes", "time", "ratio", "compile", "modelled", "info"]

#: Accepted units and the kind each implies. ``record()`` rejects any other unit.
UNITS: dict[str, Kind] = {
    "count": "count",
    "ops": "count",
    "syncs": "count",
    "launches": "count",
    "calls": "count",
    "flops": "count",
    "bytes": "bytes",
    "bytes/sample": "bytes",
    "s": "time",
    "ratio": "ratio",
    #: compile time (``perf.count_compiles``): its own kind, compared only between runs with
    #: the same Inductor cache state (cold / warm), never re-measured with the timings
    "compile_s": "compile",
    #: modelled GPU seconds (``perf.model_gpu_time``): deterministic, gated like a count with a
    #: small tolerance, never timed or re-measured
    "modelled_s": "modelled",
    "1": "info",
    "elements": "info",
    "samples": "info",
    "r2": "info",
}


@dataclass(frozen=True)
class Metric:
    """One recorded figure. Raw samples are kept so later statistics need no re-run."""

    name: str
    #: An ``int`` for counts (exact at any size, in JSON too), else a float.
    value: float | int
    unit: str
    kind: Kind
    #: Relative margin for this metric, overriding the per-kind default of the gate.
    tolerance: float | None = None
    #: For ``ratio`` metrics: is a larger value better (e.g. a speed-up)?
    higher_is_better: bool = False
    #: Raw per-call samples in seconds (``time``), or paired per-sample ratios (``ratio``).
    samples: tuple[float, ...] = ()
    #: Confidence interval (low, high) of ``value`` and its confidence level.
    ci: tuple[float, float] | None = None
    confidence: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Set at ``--benchmark-autosave`` on a time whose samples cannot anchor a verdict
    #: (:mod:`perf.gate.dispersion`): why. Stored since schema 4.
    noisy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "kind": self.kind,
        }
        if self.tolerance is not None:
            d["tolerance"] = self.tolerance
        if self.higher_is_better:
            d["higher_is_better"] = True
        if self.samples:
            d["samples"] = list(self.samples)
        if self.ci is not None:
            d["ci"] = list(self.ci)
            d["confidence"] = self.confidence
        if self.extra:
            d["extra"] = dict(self.extra)
        if self.noisy:
            d["noisy"] = self.noisy
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metric:
        ci = d.get("ci")
        from dataclasses import replace

        noisy = d.get("noisy")
        m = make_metric(
            d["name"],
            d["value"],
            unit=d["unit"],
            tolerance=d.get("tolerance"),
            higher_is_better=bool(d.get("higher_is_better", False)),
            samples=d.get("samples", ()),
            ci=(float(ci[0]), float(ci[1])) if ci is not None else None,
            confidence=d.get("confidence"),
            extra=d.get("extra") or {},
        )
        return replace(m, noisy=str(noisy)) if noisy else m


def kind_of(unit: str) -> Kind:
    try:
        return UNITS[unit]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r}; use one of: {', '.join(sorted(UNITS))}") from None


#: Bounds of what ``extra`` may hold; the baseline loader refuses anything beyond them
#: (deeper nesting, longer number literals), so a recorded metric can always be read back.
MAX_EXTRA_DEPTH = 8
MAX_INT_DIGITS = 30


def check_json_value(value: Any, where: str, depth: int = 0) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``value`` survives JSON and xdist unchanged.

    Allowed: None, bool, str, int (at most 30 digits), finite float, list, dict with str
    keys. Refused: NaN/inf (invalid JSON), tuples (come back as lists), non-str keys (come
    back as str), and any other object (``torch.dtype``, tensors, numpy scalars...): xdist
    cannot send them, and ``json`` cannot write them.
    """
    if depth > MAX_EXTRA_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_EXTRA_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return
    if type(value) is int:
        if len(str(abs(value))) > MAX_INT_DIGITS:
            raise ValueError(f"{where}: integer with more than {MAX_INT_DIGITS} digits")
        return
    if type(value) is float:
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not valid JSON; record a finite number or None")
        return
    if type(value) is list:
        for i, v in enumerate(value):
            check_json_value(v, f"{where}[{i}]", depth + 1)
        return
    if type(value) is dict:
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(
                    f"{where}: key {k!r} is a {type(k).__name__}; JSON keys are strings "
                    f"(it would come back as {str(k)!r})"
                )
            check_json_value(v, f"{where}[{k!r}]", depth + 1)
        return
    hint = " (use a list)" if isinstance(value, tuple) else " (convert: int(), float(), str())"
    raise ValueError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} does not survive "
        f"JSON and xdist unchanged{hint}; allowed: None, bool, int, finite float, str, "
        "list, dict with str keys"
    )


def _count_value(name: str, value: Any) -> int:
    """A count as an exact int: ints, integer numpy scalars / tensors, whole floats."""
    if isinstance(value, bool):
        raise ValueError(f"metric {name!r}: a count must be a whole number, got {value!r}")
    try:
        n: int | None = operator.index(value)  # int, numpy integer, integer 0-dim tensor
    except TypeError:
        n = None
    if n is None:
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"metric {name!r}: value must be a number (a count: a whole number), "
                f"got {type(value).__name__}"
            ) from None
        if not math.isfinite(f):
            raise ValueError(f"metric {name!r}: value must be finite, got {f}")
        if f != int(f):
            raise ValueError(f"metric {name!r}: a count must be a whole number, got {f}")
        n = int(f)
    if n < 0:
        raise ValueError(f"metric {name!r}: a count cannot be negative, got {n}")
    if len(str(n)) > MAX_INT_DIGITS:
        raise ValueError(f"metric {name!r}: a count with more than {MAX_INT_DIGITS} digits")
    return int(n)


def instrument_figure(value: Any) -> tuple[Any, str, dict[str, Any]] | None:
    """The figure an instrument's result stands for, its unit and the extra data that names
    its sites (None: ``value`` is no instrument result). Recording the result, not one of its
    numbers, keeps the sites with the figure, so a regression names its line:

    - :class:`~perf.instruments.syncs.SyncCount`: ``count`` syncs, ``sync_sites``;
    - :class:`~perf.instruments.ops.OpCount`: ``count`` ops;
    - :class:`~perf.instruments.transfers.TransferCount`: host<->device copies (count);
    - :class:`~perf.instruments.compiles.CompileCount`: ``graph_breaks`` (count) and their
      ``sites`` (``c.record(perf_metrics)`` records graphs and recompiles too);
    - :class:`~perf.instruments.memory.PeakMemory`: ``peak_bytes``;
    - :class:`~perf.instruments.leaks.MemoryGrowth`: ``growth_bytes_per_step`` and the
      grown lines as ``sites``.

    ``Timing`` and ``Comparison`` keep their samples (:func:`make_metric`)."""
    where = (type(value).__module__, type(value).__name__)
    if where not in _RESULTS:
        return None  # a number, a Timing, a Comparison: no instrument module is imported
    if where == ("perf.instruments.memory", "PeakMemory") and value.peak_bytes is None:
        raise ValueError(
            f"a PeakMemory of {value.device} has no peak (the device keeps no allocator "
            "statistics): record a figure you have, or measure on cuda or sim"
        )
    return _RESULTS[where](value)


#: (module, class) of an instrument's result -> (figure, unit, extra with its sites).
_RESULTS: dict[tuple[str, str], Any] = {
    ("perf.instruments.syncs", "SyncCount"): lambda r: (r.count, "syncs", {"sync_sites": r.sites}),
    ("perf.instruments.ops", "OpCount"): lambda r: (r.count, "ops", {}),
    ("perf.instruments.transfers", "TransferCount"): lambda r: (
        r.h2d_copies + r.d2h_copies,
        "count",
        {},
    ),
    ("perf.instruments.compiles", "CompileCount"): lambda r: (
        r.graph_breaks,
        "count",
        {"sites": r.break_sites},
    ),
    ("perf.instruments.memory", "PeakMemory"): lambda r: (r.peak_bytes, "bytes", {}),
    ("perf.instruments.leaks", "MemoryGrowth"): lambda r: (
        r.growth_bytes_per_step,
        "bytes",
        {"sites": r.sites_extra},
    ),
}


def make_metric(
    name: str,
    value: Any,
    *,
    unit: str | None = None,
    tolerance: float | None = None,
    higher_is_better: bool | None = None,
    samples: Any = (),
    ci: tuple[float, float] | None = None,
    confidence: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Metric:
    """Validate and build a :class:`Metric`.

    ``value`` may be a number, a :class:`perf.instruments.timing.Timing` (recorded as its
    median, unit ``s``, raw samples kept), a :class:`perf.instruments.timing.Comparison` (its
    ratio, unit ``ratio``, paired samples and interval kept) or another instrument's result
    (its figure with its sites: :func:`instrument_figure`). Raises ``ValueError`` for NaN/inf,
    negative counts or bytes, an unknown unit, or a tolerance outside [0, 10].
    """
    from perf.instruments.timing import Comparison, Timing  # local: timing imports torch

    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"metric name must be a non-empty string without spaces, got {name!r}")
    try:
        figure = instrument_figure(value)
    except ValueError as e:
        raise ValueError(f"metric {name!r}: {e}") from None
    if figure is not None:
        value, own_unit, sites = figure
        unit = unit or own_unit
        extra = {**sites, **(extra or {})}  # the caller's own sites= / sync_sites= win
    elif isinstance(value, Timing):
        unit = unit or "s"
        samples = value.samples_s
        value = value.median_s
    elif isinstance(value, Comparison):
        unit = unit or "ratio"
        samples = value.ratios
        # an inconclusive comparison (dependent pairs, too few pairs) states no interval
        ci = value.ci if value.conclusive else None
        confidence = value.confidence
        value = value.ratio
    if unit is None:
        raise ValueError(f"metric {name!r}: unit= is required for a plain number")
    kind = kind_of(unit)
    for key, v in (extra or {}).items():
        if not isinstance(key, str):
            raise ValueError(f"metric {name!r}: extra key {key!r} must be a str")
        check_json_value(v, f"metric {name!r}: extra {key!r}")
    if kind == "count":
        value = _count_value(name, value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars, 0-dim tensors
        except (TypeError, ValueError):
            raise ValueError(
                f"metric {name!r}: value must be a number, Timing or Comparison, "
                f"got {type(value).__name__}"
            ) from None
    if kind != "count":
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r}: value must be finite, got {value}")
        if kind in ("bytes", "time", "compile", "modelled") and value < 0:
            raise ValueError(f"metric {name!r}: a {kind} cannot be negative, got {value}")
    if tolerance is not None:
        tolerance = float(tolerance)
        if not (0.0 <= tolerance <= 10.0) or math.isnan(tolerance):
            raise ValueError(
                f"metric {name!r}: tolerance is a relative margin in [0, 10] "
                f"(0.05 = 5%), got {tolerance}"
            )
    samples_t = tuple(float(s) for s in samples)
    if any(not math.isfinite(s) for s in samples_t):
        raise ValueError(f"metric {name!r}: samples must be finite")
    if ci is not None:
        ci = (float(ci[0]), float(ci[1]))
        if not all(math.isfinite(c) for c in ci):
            raise ValueError(f"metric {name!r}: ci must be finite, got {ci}")
    if confidence is not None:
        confidence = float(confidence)
    if higher_is_better is None:
        higher_is_better = False
    return Metric(
        name=name,
        value=value,
        unit=unit,
        kind=kind,
        tolerance=tolerance,
        higher_is_better=bool(higher_is_better),
        samples=samples_t,
        ci=ci,
        confidence=confidence,
        extra=dict(extra or {}),
    )
