"""The cold-start benchmark's reading of ``-X importtime`` and its report."""

from __future__ import annotations

from benchmarks.cold_start import markdown, top_imports

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:       900 |       5000 | site
import time:      3000 |     144000 |     numpy
import time:      1000 |       1000 |       numpy.version
import time:      2000 |    1129000 | torch
import time:       500 |      70000 |   pydantic
import time:       400 |     400000 | parityserve
parityserve: some line the server printed
"""


def test_the_total_is_every_modules_own_time_and_the_top_lists_package_roots() -> None:
    found = top_imports(IMPORTTIME, n=2)
    assert found["total_ms"] == (120 + 900 + 3000 + 1000 + 2000 + 500 + 400) / 1000
    # nested roots count (numpy under site), submodules and parityserve itself do not
    assert found["top"] == [{"module": "torch", "cumulative_ms": 1129.0},
                            {"module": "numpy", "cumulative_ms": 144.0}]


def test_the_report_has_medians_with_their_counts_and_the_command() -> None:
    out = {"rounds": 3, "machine": "2 cores", "systems": ["a", "b"], "command": "python -m x",
           "starts": {"a": [1.0, 3.0, 2.0], "b": [5.0]},
           "imports": {"a": {"total_ms": 700.0, "top": [{"module": "numpy",
                                                          "cumulative_ms": 144.0}]}}}
    text = markdown(out)
    assert "| a | 2.00 | 1.00 | 3.00 | 3 |" in text and "| b | 5.00 | 5.00 | 5.00 | 1 |" in text
    assert "700 ms in all" in text and "| numpy | 144 |" in text
    assert text.rstrip().endswith("python -m x")
