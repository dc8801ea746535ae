"""Records every optional framework a process really loads (not merely looks for).

Put this folder first on ``PYTHONPATH`` with ``PARITYSERVE_WATCH_IMPORTS`` (comma-separated
top-level names) and ``PARITYSERVE_IMPORT_LOG`` (a file) set: each watched module whose code
runs in this process, or any child that inherits the environment, appends one JSON line
with the pid, the command line and the chain of parityserve frames that imported it. A
probe such as ``importlib.util.find_spec("torch")`` runs no module code and is not recorded.
"""

import importlib.abc
import json
import os
import sys
import traceback

_WATCHED = frozenset(filter(None, os.environ.get("PARITYSERVE_WATCH_IMPORTS", "").split(",")))
_LOG = os.environ.get("PARITYSERVE_IMPORT_LOG", "")


class _RecordingLoader(importlib.abc.Loader):
    def __init__(self, name, loader):
        self._name, self._loader = name, loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        frames = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                  if "parityserve" in f.filename and "import_watch" not in f.filename]
        with open(_LOG, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[:4],
                                  "module": self._name, "chain": frames}) + "\n")
        self._loader.exec_module(module)


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RecordingLoader(name, spec.loader)
        return spec


if _WATCHED and _LOG:
    sys.meta_path.insert(0, _Watch())
