"""Floor 2: the instruments. Device-correct timing (:mod:`~perf.instruments.timing`), exact
counters of syncs, ops, transfers and FLOPs (:mod:`~perf.instruments.syncs`,
:mod:`~perf.instruments.ops`, :mod:`~perf.instruments.transfers`,
:mod:`~perf.instruments.flops`), memory meters
(:mod:`~perf.instruments.memory`), GPU health checks (:mod:`~perf.instruments.health`) and the
Chrome traces of failing timing tests (:mod:`~perf.instruments.trace`).

Each is usable from a plain Python script; :mod:`perf` lists the public names.
"""
