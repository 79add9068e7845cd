"""Paper reproductions: ``seqmem repro <paper>`` runs ``seqmem.repro.<paper>``.

Each module (or package, such as ``seqmem.repro.elastic``) defines ``add_arguments(parser)`` (optional; ``--scale``
and ``--out`` are added for it) and ``run(args) -> int``.  Results go to ``args.out`` (default
``docs/results/<paper>/`` is NOT overwritten unless asked) as Markdown tables (paper | ours | our scale), JSON and
PNG plots, via :mod:`seqmem.repro.common`.
"""
