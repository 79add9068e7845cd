"""Paper reproductions: ``seqmem repro <paper>`` runs ``seqmem.repro.<paper>``.

Each paper is a package that defines ``add_arguments(parser)`` (optional; ``--scale`` and ``--out`` are added for
it), ``run(args) -> int`` and ``SCALES``.  Results go to ``args.out`` (default ``docs/results/<paper>/`` is NOT
overwritten unless asked) as Markdown tables (paper | ours | our scale), JSON and PNG plots.

Layout of a paper's package: ``configs.py`` holds its scales and model specs and ``paper.py`` the paper's numbers,
both plain data; one module per experiment or table (and ``models.py`` for what they train); ``runner.py`` holds
``run`` (the command); ``__init__.py`` only re-exports.  What every paper shares comes from
:mod:`seqmem.repro.common`: ``fit_lm`` (seed, build and train a language model with :func:`seqmem.train.train`),
``torch_threads``, ``mean_std`` (:func:`seqmem.io.mean_std`), ``write_results``, ``figure`` (a saved, closed
matplotlib figure), ``write_json`` and the atomic writers.
"""
