"""What every ``python -m benchmarks.<name>`` shares (benchmarks/_cli.py), and the bench-extra
check that it, ``parityserve bench overhead`` and the plots run first."""

from __future__ import annotations

import argparse
import signal

import pytest

from benchmarks import _cli
from parityserve.bench import extra
from parityserve.errors import ConfigError, ParityServeError


def _experiment(outcome: BaseException | int):
    def run(args: argparse.Namespace) -> int:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--quick", action="store_true")
        p.set_defaults(func=run)

    return _cli.build_parser("demo", "a test experiment", _cli.examples(
        [("python -m benchmarks.demo --quick", "fast")]), add_arguments)


@pytest.fixture(autouse=True)
def _keep_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize(("outcome", "status"), [
    (0, 0), (3, 3), (ConfigError("bad flag"), 2), (KeyboardInterrupt(), 130),
])
def test_exit_status_of_an_experiment(outcome, status, capsys) -> None:
    assert _cli.main(_experiment(outcome), ["--quick"]) == status
    if status == 2:
        assert capsys.readouterr().err == "python -m benchmarks.demo: error: bad flag\n"


def test_a_missing_bench_extra_stops_it_before_it_runs(monkeypatch, capsys) -> None:
    monkeypatch.setattr(extra, "BENCH_MODULES", ("no_such_module_for_this_test",))
    assert _cli.main(_experiment(RuntimeError("must not run")), []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'parityserve[bench]'" in err
    assert "no_such_module_for_this_test" in err


def test_require_bench_extra_names_what_is_missing() -> None:
    extra.require_bench_extra("x")  # installed here (dev pulls in the extra)
    with pytest.raises(ParityServeError, match=r"plotting needs nope_a and nope_b, which a "
                                               r"plain install leaves out: pip install"):
        extra.require_bench_extra("plotting", ["nope_a", "json", "nope_b"])
