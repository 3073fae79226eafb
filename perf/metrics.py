"""The metric record: one named figure of one test, with the unit that decides how it is gated.

A metric travels from a test (``perf_metrics.record``) through the pytest report (as a plain
dict, so it survives xdist) to the terminal summary and the baseline store. Its *kind* is
derived from its unit and decides the comparison policy (design.md, "Metrics model"):

- ``count``: exact; any increase is a regression.
- ``bytes``: relative tolerance.
- ``time`` / ``ratio``: statistical, only against a run with the same machine fingerprint.
- ``info``: recorded for trend plots and reports, never gated (sizes, fits, R²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["count", "bytes", "time", "ratio", "info"]

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
    "1": "info",
    "elements": "info",
    "samples": "info",
    "r2": "info",
}


@dataclass(frozen=True)
class Metric:
    """One recorded figure. Raw samples are kept so later statistics need no re-run."""

    name: str
    value: float
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
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metric:
        ci = d.get("ci")
        return make_metric(
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


def kind_of(unit: str) -> Kind:
    try:
        return UNITS[unit]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r}; use one of: {', '.join(sorted(UNITS))}") from None


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

    ``value`` may be a number, a :class:`perf.timing.Timing` (recorded as its median, unit
    ``s``, raw samples kept) or a :class:`perf.timing.Comparison` (its ratio, unit ``ratio``,
    paired samples and interval kept). Raises ``ValueError`` for NaN/inf, negative counts or
    bytes, an unknown unit, or a tolerance outside [0, 10].
    """
    from perf.timing import Comparison, Timing  # local: timing imports torch

    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"metric name must be a non-empty string without spaces, got {name!r}")
    if isinstance(value, Timing):
        unit = unit or "s"
        samples = value.samples_s
        value = value.median_s
    elif isinstance(value, Comparison):
        unit = unit or "ratio"
        samples = value.ratios
        ci = value.ci
        confidence = value.confidence
        value = value.ratio
    if unit is None:
        raise ValueError(f"metric {name!r}: unit= is required for a plain number")
    kind = kind_of(unit)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars, 0-dim tensors
        except (TypeError, ValueError):
            raise ValueError(
                f"metric {name!r}: value must be a number, Timing or Comparison, "
                f"got {type(value).__name__}"
            ) from None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"metric {name!r}: value must be finite, got {value}")
    if kind in ("count", "bytes", "time") and value < 0:
        raise ValueError(f"metric {name!r}: a {kind} cannot be negative, got {value}")
    if kind == "count" and value != int(value):
        raise ValueError(f"metric {name!r}: a count must be a whole number, got {value}")
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
