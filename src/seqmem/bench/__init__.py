"""``seqmem bench``: training speed (``speed``) and decode cost (``decode``) of every registered mixer.

A benchmark, not a test: it measures, prints Markdown tables, and writes JSON records (``--json``) and PNG plots
(``--plot``).  See ``docs/BENCHMARKS.md`` for the latest full CPU run and its analysis.
"""
