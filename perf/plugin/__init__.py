"""perf's one pytest plugin (the ``pytest11`` entry point ``perf``): ``-p no:perf`` turns all
of perf off.

One session object, :class:`perf.plugin.session.PerfSession` (in ``config.stash``), owns the
options, the metrics the tests recorded, the gates and the reports. The hooks are defined in
the modules of :data:`pytest_plugins`, and only there: pytest registers each of them when it
loads this module (a plugin module's ``pytest_plugins`` is honoured like a conftest's), and
no module imports another's hooks (``tests/harness/test_plugin_session.py`` checks it), so
tidying an import never disables a hook.

- :mod:`perf.plugin.core`: options, markers, the ``device`` / ``tensor_size`` fixtures;
- :mod:`perf.plugin.metrics`: the ``perf_metrics`` fixture and the metric channel;
- :mod:`perf.plugin.gate`: the baseline store and gate on pytest-benchmark's options, and the
  session end of every gate;
- :mod:`perf.plugin.benchmark`: pytest-benchmark's ``benchmark`` fixture under perf;
- :mod:`perf.plugin.against`: ``--perf-against=REF``;
- :mod:`perf.plugin.trace`: ``--perf-trace-dir``;
- :mod:`perf.plugin.memviz`: memory snapshots of failing memory tests (``perf_memory``);
- :mod:`perf.plugin.rehearse`: the CUDA rehearsal (``--perf-rehearse-cuda``) and the GPU pool
  (``--perf-gpu-per-worker``).

Loading it imports neither torch nor numpy nor the instruments (:mod:`perf.plugin.guest`).
"""

#: The order is the order of the terminal sections, last first (pluggy calls hooks LIFO).
pytest_plugins = [
    "perf.plugin.core",
    "perf.plugin.metrics",
    "perf.plugin.gate",
    "perf.plugin.benchmark",
    "perf.plugin.against",
    "perf.plugin.trace",
    "perf.plugin.memviz",
    "perf.plugin.rehearse",
]
