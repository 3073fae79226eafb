"""Floor 4: what people read. Terminal tables and Markdown with escaping of untrusted text
(:mod:`~perf.report.text`) and plots of stored runs (:mod:`~perf.report.plots`, optional
matplotlib).
"""
