"""Run real training code, unmodified, on the simulated device and print what it counted.

A field check, not a test: ``python benchmarks/field_sim.py CHECKOUT SCRIPT [-- ARGS...]``
runs ``CHECKOUT/SCRIPT`` (a checkout of public training code, not committed here) with
``ARGS`` as its command line, from ``CHECKOUT`` as the working directory, after installing
``perf.simulated_device()``, and prints one JSON object:

- ``ran``: whether the script ran to its end (``SystemExit(0)`` counts as ran);
- ``error``: the exception's type and message and the frame it came from, where it did not;
- ``syncs``, ``by_op``, ``by_site`` (the ten busiest lines) and the transfer counts, of
  everything the script did until it ended or failed;
- ``seconds``: its wall time.

Point the script at the device the way it expects one: most take an argument
(``-- --device sim``); device-agnostic code (``torch.accelerator.current_accelerator()``) needs
none; Hugging Face's ``Trainer`` and ``accelerate`` take ``ACCELERATE_TORCH_DEVICE=sim``, set
here as ``python -m perf sim`` sets it. Code that asks ``torch.cuda.is_available()`` takes its
CPU branches here: see docs/sim.md, "Code that names CUDA". Exit status: 0 when it ran, 1
when it failed.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

import perf


def _where(exc: BaseException, checkout: str) -> str:
    """The innermost frame in the checkout's own code (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith(checkout + os.sep)]
    f = (own or frames or [None])[-1]
    return "" if f is None else f"{os.path.relpath(f.filename, checkout)}:{f.lineno}"


def run(checkout: str, script: str, args: list[str]) -> dict[str, Any]:
    """Run one script on sim; the JSON-ready result (see the module docstring)."""
    checkout = os.path.abspath(checkout)
    path = os.path.join(checkout, script)
    if not os.path.isfile(path):
        raise SystemExit(f"field_sim: no script {script!r} in {checkout!r}")
    dev = perf.simulated_device()
    from perf.sim.device import ACCELERATE_ENV

    os.environ.setdefault(ACCELERATE_ENV, dev.type)  # as `python -m perf sim` sets it
    old_argv, old_cwd, old_path = sys.argv, os.getcwd(), list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    os.chdir(checkout)
    error = None
    t0 = time.perf_counter()
    with perf.count_syncs(dev) as s, perf.count_transfers() as t:
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                error = {"type": "SystemExit", "message": str(e.code), "where": _where(e, checkout)}
        except Exception as e:  # a field run reports any failure instead of dying
            error = {
                "type": type(e).__name__,
                "message": str(e)[:500],
                "where": _where(e, checkout),
            }
        finally:
            seconds = time.perf_counter() - t0
            sys.argv, sys.path[:] = old_argv, old_path
            os.chdir(old_cwd)
    r = s.result()
    busiest = sorted(r.by_site.items(), key=lambda kv: -kv[1])[:10]
    return {
        "script": script,
        "ran": error is None,
        "error": error,
        "syncs": r.count,
        "by_op": r.by_op,
        "by_site": dict(busiest),
        "h2d_copies": t.h2d_copies,
        "h2d_bytes": t.h2d_bytes,
        "d2h_copies": t.d2h_copies,
        "d2h_bytes": t.d2h_bytes,
        "seconds": round(seconds, 3),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    checkout, script, rest = argv[0], argv[1], argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    result = run(checkout, script, rest)
    print(json.dumps(result, indent=1))
    return 0 if result["ran"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
