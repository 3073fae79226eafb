"""The JSON baseline store: one file per run, numbered per machine, never rewritten.

Layout (inside pytest-benchmark's storage folder, ``.benchmarks`` by default)::

    .benchmarks/
      Linux-CPython-3.11-64bit/0001_<tag>.json      <- pytest-benchmark's own runs
      perf/Linux-CPython-3.11-64bit/0001_<tag>.json <- ours (this module)

pytest-benchmark globs ``<storage>/<machine>/*.json`` and ``<storage>/*.json`` only, so our
files, one level deeper under ``perf/``, never reach its loader (and its files never reach
ours). The machine folder uses pytest-benchmark's machine id so users find runs where they
expect them; the full fingerprint inside each file decides whether timings are comparable.

Why these rules:

- *JSON only, validated strictly*: a baseline comes from CI caches and artifacts; nothing in
  it is executed or unpickled, and a damaged file stops the gate with the file name and the
  problem instead of silently gating against nothing.
- *Atomic, append-only writes*: a run is written to a temp file in the same folder and then
  hard-linked (or, where links are unsupported, renamed) to its final name under a file lock,
  so a crash leaves no half file, two writers never get the same number, and an existing run
  is never overwritten. Temp files exist only while their writer holds the lock, so any
  found by the next writer under the lock were left by a killed save and are removed.
- *Bounded input*: duplicate keys (a crafted file could hide a regression behind a second
  value), nesting deeper than :data:`MAX_DEPTH` and number literals longer than
  :data:`MAX_NUMBER_CHARS` are refused before any of it is used.
- *Partial runs are marked*: a run stopped early or with failed tests is stored with
  ``run.partial`` saying why, and the default compare target skips it.

The format history is in ``docs/baseline-format.md``; bump :data:`SCHEMA_VERSION` there too.
"""

from __future__ import annotations

from perf.store.files import Store, test_path_problem
from perf.store.runs import (
    BaselineNotFound,
    NotARun,
    Run,
    RunRef,
    commit_info,
    default_tag,
    load,
    machine_name,
    make_run,
    name_problem,
    now_iso,
    partial_reason,
    storage_root,
)
from perf.store.schema import (
    BAD_NAME_CHARS,
    DEFAULT_STORAGE,
    FORMAT,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NUMBER_CHARS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    SUBDIR,
    BaselineError,
    parse,
    validate,
)

__all__ = [
    "BAD_NAME_CHARS",
    "DEFAULT_STORAGE",
    "FORMAT",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_NUMBER_CHARS",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "SUBDIR",
    "BaselineError",
    "BaselineNotFound",
    "NotARun",
    "Run",
    "RunRef",
    "Store",
    "commit_info",
    "default_tag",
    "load",
    "machine_name",
    "make_run",
    "name_problem",
    "now_iso",
    "parse",
    "partial_reason",
    "storage_root",
    "test_path_problem",
    "validate",
]
