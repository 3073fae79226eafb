"""Sphinx configuration: Markdown pages (MyST) and an API reference from the docstrings.

Built in CI with warnings as errors: ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import perf

project = "pytest-torch-perf"
author = "the perf developers"
release = perf.__version__
copyright = "the perf developers, BSD-3-Clause"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
html_theme = "furo"
html_title = "pytest-torch-perf"
# furo shows 88 monospace characters in a code block without scrolling; program output
# (```text) wraps instead (docs/_static/perf.css; test_docs.py checks both).
html_static_path = ["_static"]
html_css_files = ["perf.css"]
# The docstrings name private helpers and torch internals in :class: / :func: roles; a missing
# target is not an error (Sphinx's default), a broken page is.
nitpicky = False
