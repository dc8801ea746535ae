"""Paper reproductions and research experiments, kept out of the installed package.

Each experiment runs from the project root as ``python -m benchmarks.<name>`` (or
``make bench-<name>``) and writes JSON, markdown, plots and its command to
``benchmarks/results/``. They need the ``bench`` extra: ``pip install -e '.[bench]'``.

    tail        ParM §6: tail latency per redundancy mode under background bursts, codec timing
    accuracy    ParM and ApproxIFER accuracy: A_a, A_d, A_o, stragglers, Byzantine workers
    selection   Clipper's Figures 8 and 9: bandits under model failure, stragglers
    simulate    the discrete-event simulator: validated on real runs, projected to 1,000

What a user runs against their own server (the load generator, ``parityserve bench
overhead``) stays in the package, under ``parityserve.bench``.
"""
