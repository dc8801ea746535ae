"""``load_stateful``: a stateful operator from a source string (re-exported by
``parityserve.models.stateful``). It imports through the same code as ``load_model``'s
``python:`` sources (``_imports``), so both accept the same references."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from parityserve.errors import ModelLoadError
from parityserve.models._imports import import_object, instantiate
from parityserve.models._stateful_ops import OnlineMLP
from parityserve.models._stateful_run import AnyStatefulOperator
from parityserve.models._stream_lstm import StreamLSTM
from parityserve.models._stream_mean import StreamMean

__all__ = ["STATEFUL_ZOO", "load_stateful"]

_ZOO: dict[str, Callable[..., AnyStatefulOperator]] = {
    "online-mlp": OnlineMLP,
    "stream-lstm": StreamLSTM,
    "stream-mean": StreamMean,  # the run form
}
STATEFUL_ZOO: tuple[str, ...] = tuple(_ZOO)
# each form by name, with its methods; an operator must have every method of one of them
_FORMS = {"three-method": ("initialize", "compute", "update"), "run": ("initialize", "run")}
_ACCEPTED = ("zoo:NAME with NAME one of " + ", ".join(STATEFUL_ZOO)
             + ", python:package.module:Class or python:path/file.py:Class")


def load_stateful(source: str, options: Mapping[str, Any] | None = None, *,
                  base_dir: Path | None = None) -> AnyStatefulOperator:
    """The operator ``source`` names, built with ``options`` as keyword arguments:
    ``zoo:NAME`` (``STATEFUL_ZOO``), ``python:pkg.mod:Class`` or ``python:path/file.py:Class``
    (relative to ``base_dir``, else the working folder), in either form (three methods, or
    ``run``). Every failure is a ``ModelLoadError`` saying what is wrong and what is
    accepted."""
    scheme, sep, target = source.partition(":")
    if scheme == "zoo" and sep:
        if target not in _ZOO:
            raise ModelLoadError(f"unknown stateful operator {source!r}: the stateful zoo has "
                                 + ", ".join(f"zoo:{name}" for name in STATEFUL_ZOO))
        factory: Any = _ZOO[target]
    elif scheme == "python" and target:
        factory = import_object(target, base_dir=base_dir)
    else:
        raise ModelLoadError(f"cannot load stateful operator source {source!r}: expected "
                             f"{_ACCEPTED}")
    options = dict(options or {})
    if inspect.isclass(factory):  # before building it: its missing methods are the news
        _check_operator(factory, source)
    _check_option_names(factory, options, source)
    return _check_operator(instantiate(factory, options, source=source), source)


def _check_option_names(factory: Any, options: Mapping[str, Any], source: str) -> None:
    """Name the accepted options when one is unknown (``instantiate`` only relays Python's
    "unexpected keyword argument")."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # not introspectable: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ModelLoadError(f"{source}: unknown option(s) {', '.join(unknown)}; it accepts "
                             f"{', '.join(accepted) or 'no options'}")


def _check_operator(obj: Any, source: str) -> AnyStatefulOperator:
    lacks = {form: [name for name in methods if not callable(getattr(obj, name, None))]
             for form, methods in _FORMS.items()}
    if all(lacks.values()):
        what = obj.__name__ if inspect.isclass(obj) else type(obj).__name__
        raise ModelLoadError(
            f"{source}: {what} is not a stateful operator: it fits neither form "
            + "; ".join(f"(the {form} form lacks {', '.join(f'{n}()' for n in missing)})"
                        for form, missing in lacks.items())
            + ". The three-method form defines initialize() -> state tensors by name, "
            "compute(batch, state) -> (outputs, pending), which only reads the state, and "
            "update(state, pending), which writes it; the run form defines initialize() and "
            "run(batch, state, event) -> outputs, which writes the state only after "
            "event.wait() returns")
    return cast(AnyStatefulOperator, obj)
