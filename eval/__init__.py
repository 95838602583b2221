"""embedrank's evaluations, benchmarks and fuzzing, run from the repository's root.

    python eval/run.py scifact                  # retrieval quality on a BEIR collection (the quality CLI)
    python -m eval bench --list                 # every benchmark, by name
    python -m eval bench NAME [ARG...]          # run one (its arguments as recorded, else ARG...)
    python -m eval record NAME                  # run it, record it in eval/results/NAME.json, render the pages
    python -m eval render [--check]             # the docs' benchmark pages from eval/results/

- ``harness/``: what the benchmarks share: the record and the pages rendered from it, load generators and
  clients, timing and memory statistics, synthetic stores;
- ``benchmarks/``: speed, memory and isolation, one module each, each exposing ``run(argv)``; the registry
  (``eval.benchmarks.REGISTRY``) names them and the arguments of their records;
- ``quality/``: quality checks beside ``run.py`` (the support matrix, image parity, compact vectors);
- ``fuzz/``: schemathesis and the edge cases of every operation's schema.
"""
