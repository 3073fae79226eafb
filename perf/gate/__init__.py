"""Floor 4: verdicts. Per-metric policies against a stored run (:mod:`~perf.gate.compare`),
interleaved base-vs-head measurement in git worktrees (:mod:`~perf.gate.against`), re-measuring
children (:mod:`~perf.gate.remeasure`) and the checks of the gate's options
(:mod:`~perf.gate.validate`). No pytest here: :mod:`perf.plugin` is the glue.
"""
