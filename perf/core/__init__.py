"""Floor 1: the machine and the numbers. Device discovery and the machine fingerprint
(:mod:`~perf.core.devices`), statistics as pure functions of raw samples
(:mod:`~perf.core.stats`), and how much CPU the neighbours used (:mod:`~perf.core.contention`).

Nothing here imports from the floors above.
"""
