"""Measuring a server you run: the open-loop load generator (``loadgen``) and
``parityserve bench overhead`` with what it needs. ``bench overhead`` needs the ``bench`` extra
(aiohttp, matplotlib: ``pip install 'parityserve[bench]'``); without it the load generator runs
on httpx, so ``parityserve demo`` works on a plain install.

The paper reproductions (tail, accuracy, selection, simulate) live outside the package, in the
top-level ``benchmarks/`` tree: ``python -m benchmarks.<name>`` from a source checkout.
"""
