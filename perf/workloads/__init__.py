"""Reference workloads: data, models, datasets and loops that the property suite measures.

Importable from plain scripts (no pytest): ``from perf.workloads.data import load_iris``.
"""
