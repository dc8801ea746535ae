"""Makes the modules named in ``PARITYSERVE_REFUSE_MODULES`` (comma-separated top-level
names) absent, as in an install without their extra: an import raises ModuleNotFoundError, and
so does ``importlib.util.find_spec``. Put this folder first on ``PYTHONPATH``."""

import os
import sys

_REFUSED = frozenset(filter(None, os.environ.get("PARITYSERVE_REFUSE_MODULES", "").split(",")))


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused for this test)",
                                      name=name)
        return None


if _REFUSED:
    sys.meta_path.insert(0, _Refuse())
