"""perf's one pytest plugin (the ``pytest11`` entry point ``perf``): ``-p no:perf`` turns all
of perf off.

The glue is split by concern; pytest registers each part from :data:`pytest_plugins` when it
loads this module (a plugin module's ``pytest_plugins`` is honoured like a conftest's):

- :mod:`perf.plugin.core`: options, markers, fixtures and the metric channel;
- :mod:`perf.plugin.gate`: the baseline store and gate on pytest-benchmark's options;
- :mod:`perf.plugin.against`: ``--perf-against=REF``;
- :mod:`perf.plugin.trace`: ``--perf-trace-dir``;
- :mod:`perf.plugin.memviz`: memory snapshots of failing memory tests (``perf_memory``);
- :mod:`perf.plugin.rehearse`: the CUDA rehearsal (``--perf-rehearse-cuda``) and the GPU pool
  (``--perf-gpu-per-worker``).

Loading it imports neither torch nor the instruments (:mod:`perf.plugin.guest`).
"""

pytest_plugins = [
    "perf.plugin.core",
    "perf.plugin.gate",
    "perf.plugin.against",
    "perf.plugin.trace",
    "perf.plugin.memviz",
    "perf.plugin.rehearse",
]
