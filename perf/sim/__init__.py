"""The simulated accelerator ``sim``: a real torch device whose tensors live in host memory, so
that a CPU-only box counts what the same code causes on ``cuda:0``.

:func:`simulated_device` is the way in (also :func:`perf.simulated_device`).
"""
