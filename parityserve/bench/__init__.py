"""Measuring a server you run: what ``parityserve bench load``, ``bench overhead``,
``profile`` and ``demo`` need, and nothing else. ``bench overhead`` needs the ``bench`` extra
(aiohttp, matplotlib: ``pip install 'parityserve[bench]'``); without it the load generator runs
on httpx, so ``parityserve demo`` works on a plain install.

- ``load``, ``overhead``, ``profiler``: the commands.
- ``loadgen``, ``probe``, ``stats``: open- and closed-loop load and its percentiles.
- ``serverproc``, ``ports``: a parityserve server in a child process, on a free port.
- ``baseline_app``, ``floor_app``: the two systems ``bench overhead`` compares parityserve
  with (a bare Starlette app; the same plus one worker-process hop), started by module name.
- ``report``: results files with the command and the machine, tables, the latency plot.
- ``extra``: the clear error when the ``bench`` extra is missing.

The experiments (paper reproductions, testbeds, diagnostics) and their helpers live outside
the package, in the top-level ``benchmarks/`` tree, which imports only public names from here
(``benchmarks/report.py`` is its one surface for results and plots): ``python -m
benchmarks.<name>`` from a source checkout. ``tests/unit/test_import_graph.py`` keeps this list
and the wheel in step.
"""
