"""Floor 3: what a run leaves behind. The metric record and its units
(:mod:`~perf.store.metrics`) and the versioned JSON baseline store, one file per run, numbered
per machine, never rewritten: the format and its strict reader (:mod:`~perf.store.schema`), a
run in memory and how to get one (:mod:`~perf.store.runs`), the files on disk
(:mod:`~perf.store.files`) and shards merged into one run (:mod:`~perf.store.merge`).

Layout (inside pytest-benchmark's storage folder, ``.benchmarks`` by default)::

    .benchmarks/
      Linux-CPython-3.11-64bit/0001_<tag>.json      <- pytest-benchmark's own runs
      perf/Linux-CPython-3.11-64bit/0001_<tag>.json <- ours (this package)

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
  value), nesting deeper than :data:`~perf.store.schema.MAX_DEPTH` and number literals
  longer than :data:`~perf.store.schema.MAX_NUMBER_CHARS` are refused before any of it is
  used.
- *Partial runs are marked*: a run stopped early or with failed tests is stored with
  ``run.partial`` saying why, and the default compare target skips it.

The format history is in ``docs/baseline-format.md``; bump
:data:`~perf.store.schema.SCHEMA_VERSION` there too.
"""
