"""What the admin API may deploy: model sources, weight files and selection policies.

Configs the operator loads from disk keep full power; this policy applies only to what
arrives over HTTP. The rule: no code from the API unless ``server.allow_code_sources`` is
set, and no file from outside ``server.model_roots`` (default: the config file's folder).

- ``zoo:NAME`` runs only code shipped with parityserve: allowed.
- ``onnx:FILE`` is a graph of declared operators, no code: allowed under a root.
- ``torchscript:FILE`` is a program (the module's TorchScript code plus pickled constants,
  run by torch's interpreter, whose loader has had deserialisation bugs): code.
- ``sklearn:FILE`` is a joblib pickle, which runs whatever its ``__reduce__`` says: code.
- ``python:`` and ``torch:`` import and call any Python object: code.
- Weights from the API must be ``.npz`` (read with ``allow_pickle=False``); other weight files
  go through torch's unpickler (``weights_only``, a restricted unpickler with a history of
  bypasses), so they count as code.
- A policy other than a built-in name is imported and called in the frontend: code.

File paths are checked twice, both before anything touches the file: the path as written,
with ``..`` collapsed (so an outside path is refused without a look at the filesystem), and
then with symlinks resolved (so a link under a root cannot point out of it). Messages name
the path as the caller wrote it, never where a link leads nor whether a file exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from parityserve.config import Application, Deployment, ParityConfig, Server
from parityserve.core.selection import POLICIES
from parityserve.errors import Forbidden, InvalidInput
from parityserve.models.loader import SCHEMES

__all__ = ["CODE_SCHEMES", "FILE_SCHEMES", "SourcePolicy", "scrub_paths"]

CODE_SCHEMES: dict[str, str] = {
    "python": "it imports and calls Python code",
    "torch": "it imports and calls Python code",
    "sklearn": "a joblib file is a pickle, and unpickling runs code",
    "torchscript": "a TorchScript file is a program run by torch's interpreter",
}
FILE_SCHEMES = ("onnx", "sklearn", "torchscript")
_SAFE_WEIGHTS = (".npz",)
_HOW_TO_ALLOW = ("deploy it from the config file given to `parityserve start`, or set "
                 "server.allow_code_sources: true to let the admin API run code on this host")


@dataclass(frozen=True)
class SourcePolicy:
    """The admin API's rule for model sources; ``roots`` are absolute folders."""

    roots: tuple[Path, ...] = ()
    allow_code_sources: bool = False
    base_dir: Path | None = None

    @classmethod
    def for_server(cls, server: Server, base_dir: Path | None) -> SourcePolicy:
        """The policy a server runs with: its ``model_roots`` (relative ones against the config
        file's folder), or that folder alone when none are listed."""
        base = Path(base_dir).absolute() if base_dir is not None else None
        listed = [Path(r).expanduser() for r in server.model_roots]
        roots = [r if r.is_absolute() or base is None else base / r for r in listed]
        if not roots and base is not None:
            roots = [base]
        return cls(tuple(Path(os.path.normpath(r.absolute())) for r in roots),
                   server.allow_code_sources, base)

    # ---- checks: each raises Forbidden (403) or InvalidInput (400), else returns None ----
    def check_deployment(self, deployment: Deployment) -> None:
        self.check_source(deployment.source, deployment.weights)
        if deployment.scheduler is not None and deployment.scheduler.profile is not None:
            self.check_file(deployment.scheduler.profile, "profile file")
        if deployment.parity is not None:
            self.check_parity(deployment.parity)

    def check_parity(self, parity: ParityConfig) -> None:
        """Parity models load their own source (default: the model's, checked when it was
        deployed) and weight files."""
        if parity.source is not None:
            self.check_source(parity.source, None)
        for weights in parity.weight_files:
            if weights is not None:
                self.check_weights(weights)

    def check_application(self, app: Application) -> None:
        # make_policy imports any "mod:attr" name; a plain unknown name is a 400 from there.
        if ":" not in app.policy or self.allow_code_sources:
            return
        raise Forbidden(f"policy {app.policy!r} is not a built-in policy "
                        f"({', '.join(sorted(POLICIES))}): a custom policy runs code in the "
                        f"server, so the admin API refuses it; {_HOW_TO_ALLOW}")

    def check_source(self, source: str, weights: str | None) -> None:
        scheme, _, target = source.partition(":")
        if scheme not in SCHEMES or not target:
            raise InvalidInput(f"model source {source!r}: expected SCHEME:TARGET with SCHEME "
                               f"one of {', '.join(SCHEMES)}")
        if scheme in CODE_SCHEMES and not self.allow_code_sources:
            raise Forbidden(f"model source {source!r} runs code on the server "
                            f"({CODE_SCHEMES[scheme]}), so the admin API refuses it; "
                            f"{_HOW_TO_ALLOW}")
        if scheme in FILE_SCHEMES:
            self.check_file(target, "model file")
        if weights is not None:
            self.check_weights(weights)

    def check_weights(self, weights: str) -> None:
        self.check_file(weights, "weights file")
        if not weights.lower().endswith(_SAFE_WEIGHTS) and not self.allow_code_sources:
            raise Forbidden(f"weights file {weights!r}: through the admin API weights must be "
                            ".npz (np.savez, read without pickle); other formats go through "
                            f"torch's unpickler; convert them, or {_HOW_TO_ALLOW}")

    def check_file(self, path: str, what: str) -> None:
        """Refuse ``path`` unless it lies under a root, as written and with links resolved."""
        given = Path(path).expanduser()
        if not given.is_absolute():
            given = (self.base_dir or Path.cwd()) / given
        lexical = Path(os.path.normpath(given))  # ".." collapsed without touching the disk
        # Resolved from the path as written: the OS follows a link before a following "..",
        # so resolving the normalised path would check another file than the one opened.
        if not _under(lexical, self.roots) or not _under(
                Path(os.path.realpath(given)), [Path(os.path.realpath(r)) for r in self.roots]):
            raise Forbidden(
                f"{what} {path!r} is outside the folders the admin API may load model files "
                "from; copy it under one of server.model_roots (default: the config file's "
                "folder), or add its folder to server.model_roots")


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\"`:,;()\[\]{}]+/)*([^\s'\"`:,;()\[\]{}/]+)")


def scrub_paths(message: str) -> str:
    """``message`` with each absolute path cut to its file name: what the admin API tells a
    caller about a failed load, so an error never maps the server's folders."""
    return _ABSOLUTE_PATH.sub(lambda m: f"<path>/{m.group(1)}", message)
