"""Harness-wide setup."""

from __future__ import annotations

# perf's plugin no longer imports torch at load. pytester's in-process runs remove the modules
# an inner run imported, and torch cannot be imported a second time in one process
# (segfault): import it once here, before any inner run, so every inner run shares it.
import torch  # noqa: F401
