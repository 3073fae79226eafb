"""Floor 3: what a run leaves behind. The metric record and its units
(:mod:`~perf.store.metrics`) and the versioned JSON baseline store (:mod:`~perf.store.baseline`).
"""
