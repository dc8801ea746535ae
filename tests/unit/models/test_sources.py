"""The admin API's source policy: which model sources, weights and policies it may deploy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parityserve.config import Application, Deployment, ParityConfig, Server
from parityserve.errors import Forbidden, InvalidInput
from parityserve.models import sources as sources_module
from parityserve.models.sources import SourcePolicy, scrub_paths

OK = None


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ holds models (and links in and out); outside/ is not a root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    for f in ("model.onnx", "w.npz", "w.pt", "model.joblib", "script.pt"):
        (root / f).write_bytes(b"x")
    (outside / "secret.onnx").write_bytes(b"x")
    (outside / "w.npz").write_bytes(b"x")
    (root / "link_out.onnx").symlink_to(outside / "secret.onnx")
    (root / "dir_out").symlink_to(outside)
    (root / "link_in.onnx").symlink_to(root / "model.onnx")
    return tmp_path


def _policy(tree: Path, allow_code: bool = False) -> SourcePolicy:
    return SourcePolicy.for_server(Server(allow_code_sources=allow_code), tree / "root")


def _outcome(call) -> type[Exception] | None:
    try:
        call()
    except (Forbidden, InvalidInput) as exc:
        return type(exc)
    return None


def test_public_names() -> None:
    assert sorted(sources_module.__all__) == ["CODE_SCHEMES", "FILE_SCHEMES", "SourcePolicy",
                                              "scrub_paths"]


SOURCES = [
    # (source, weights, allow_code_sources, expected)
    ("zoo:noop", None, False, OK),
    ("zoo:lenet5", "w.npz", False, OK),
    ("zoo:lenet5", "{root}/w.npz", False, OK),
    ("zoo:lenet5", "w.pt", False, Forbidden),  # torch's unpickler: code
    ("zoo:lenet5", "w.pt", True, OK),
    ("zoo:lenet5", "{out}/w.npz", False, Forbidden),
    ("zoo:lenet5", "{out}/w.npz", True, Forbidden),  # roots hold even with code allowed
    ("zoo:no-such-model", None, False, OK),  # zoo code only: the loader names the mistake
    ("onnx:model.onnx", None, False, OK),
    ("onnx:{root}/model.onnx", None, False, OK),
    ("onnx:missing.onnx", None, False, OK),  # under a root: the loader says it is missing
    ("onnx:sub/../model.onnx", None, False, OK),
    ("onnx:link_in.onnx", None, False, OK),
    ("onnx:{out}/secret.onnx", None, False, Forbidden),
    ("onnx:{out}/missing.onnx", None, False, Forbidden),
    ("onnx:/etc/passwd", None, False, Forbidden),
    ("onnx:../outside/secret.onnx", None, False, Forbidden),
    ("onnx:sub/../../outside/secret.onnx", None, False, Forbidden),
    ("onnx:{root}/../outside/secret.onnx", None, False, Forbidden),
    ("onnx:link_out.onnx", None, False, Forbidden),  # a link under the root leading out
    ("onnx:dir_out/secret.onnx", None, False, Forbidden),
    ("onnx:dir_out/../outside/secret.onnx", None, False, Forbidden),  # ".." after a link
    ("onnx:dir_out/../root/model.onnx", None, False, OK),  # the OS lands back in the root
    ("onnx:~/model.onnx", None, False, Forbidden),
    ("python:subprocess:Popen", None, False, Forbidden),
    ("python:subprocess:Popen", None, True, OK),
    ("torch:torchvision.models:resnet18", None, False, Forbidden),
    ("torch:torchvision.models:resnet18", "w.npz", True, OK),
    ("sklearn:model.joblib", None, False, Forbidden),
    ("sklearn:{out}/secret.onnx", None, False, Forbidden),
    ("sklearn:model.joblib", None, True, OK),
    ("sklearn:{out}/evil.joblib", None, True, Forbidden),
    ("torchscript:script.pt", None, False, Forbidden),
    ("torchscript:script.pt", None, True, OK),
    ("torchscript:link_out.onnx", None, True, Forbidden),
    ("bogus:thing", None, True, InvalidInput),
    ("no-scheme", None, True, InvalidInput),
    ("onnx:", None, True, InvalidInput),
]


@pytest.mark.parametrize(("source", "weights", "allow_code", "expected"), SOURCES)
def test_model_sources(tree, source, weights, allow_code, expected) -> None:
    fill = {"root": tree / "root", "out": tree / "outside"}
    source = source.format(**fill)
    weights = weights.format(**fill) if weights else None
    policy = _policy(tree, allow_code)
    assert _outcome(lambda: policy.check_source(source, weights)) is expected
    deployment = Deployment(name="m", source=source, weights=weights)
    assert _outcome(lambda: policy.check_deployment(deployment)) is expected


PARITY = [
    # (parity config, allow_code_sources, expected)
    ({"weights": "w.npz"}, False, OK),
    ({}, False, OK),  # the model's own source, checked with the model
    ({"weights": "{out}/w.npz"}, False, Forbidden),
    ({"weights": "link_out.onnx"}, True, Forbidden),
    ({"weights": "w.pt"}, False, Forbidden),
    ({"weights": ["w.npz", "{out}/w.npz"], "r": 2}, False, Forbidden),
    ({"weights": "w.npz", "source": "python:os:system"}, False, Forbidden),
    ({"weights": "w.npz", "source": "python:os:system"}, True, OK),
    ({"source": "onnx:{out}/secret.onnx"}, True, Forbidden),
    ({"source": "zoo:lenet5"}, False, OK),
]


@pytest.mark.parametrize(("parity", "allow_code", "expected"), PARITY)
def test_parity_sources_and_weights(tree, parity, allow_code, expected) -> None:
    fill = {"out": tree / "outside"}

    def fmt(v):
        return [fmt(x) for x in v] if isinstance(v, list) else v.format(**fill)

    config = ParityConfig(**{k: fmt(v) if k != "r" else v for k, v in parity.items()})
    policy = _policy(tree, allow_code)
    assert _outcome(lambda: policy.check_parity(config)) is expected
    deployment = Deployment(name="m", source="zoo:lenet5", replicas=2, parity=config)
    assert _outcome(lambda: policy.check_deployment(deployment)) is expected


POLICIES = [
    ("single", False, OK),
    ("exp3", False, OK),
    ("exp4", False, OK),
    ("robust-exp4", False, OK),
    ("python:subprocess:Popen", False, Forbidden),
    ("subprocess:Popen", False, Forbidden),  # any "mod:attr" is imported, prefix or not
    ("no-such-policy", False, OK),  # no code: the system answers 400 for the unknown name
    ("python:subprocess:Popen", True, OK),
]


@pytest.mark.parametrize(("policy_name", "allow_code", "expected"), POLICIES)
def test_application_policies(tree, policy_name, allow_code, expected) -> None:
    app = Application(name="a", models=("m",), policy=policy_name)
    assert _outcome(lambda: _policy(tree, allow_code).check_application(app)) is expected


def test_refusals_say_how_to_allow(tree) -> None:
    policy = _policy(tree)
    with pytest.raises(Forbidden, match=r"server\.allow_code_sources: true"):
        policy.check_source("python:subprocess:Popen", None)
    with pytest.raises(Forbidden, match=r"server\.allow_code_sources: true"):
        policy.check_application(Application(name="a", models=("m",), policy="python:x:Y"))
    with pytest.raises(Forbidden, match=r"server\.model_roots"):
        policy.check_source(f"onnx:{tree}/outside/secret.onnx", None)


def test_outside_refusal_reveals_neither_existence_nor_link_targets(tree) -> None:
    policy = _policy(tree)
    messages = {}
    for name in ("secret.onnx", "missing.onnx"):
        with pytest.raises(Forbidden) as caught:
            policy.check_file(f"/x/{name}", "model file")
        messages[name] = str(caught.value).replace(name, "NAME")
    assert messages["secret.onnx"] == messages["missing.onnx"]
    with pytest.raises(Forbidden) as caught:
        policy.check_file("link_out.onnx", "model file")
    assert "outside" not in str(caught.value).split("'")[1]  # names the link, not its target
    assert str(tree / "outside") not in str(caught.value)


def test_roots_default_to_the_config_folder_and_relative_roots_resolve_against_it(tree) -> None:
    root = tree / "root"
    assert SourcePolicy.for_server(Server(), root).roots == (root,)
    listed = Server(model_roots=("../outside", "/srv/models"))
    assert SourcePolicy.for_server(listed, root).roots == (tree / "outside", Path("/srv/models"))
    assert SourcePolicy.for_server(Server(), None).roots == ()


def test_without_roots_no_file_is_allowed(tree) -> None:
    policy = SourcePolicy.for_server(Server(), None)
    assert _outcome(lambda: policy.check_source("zoo:noop", None)) is OK
    assert _outcome(lambda: policy.check_source(f"onnx:{tree}/root/model.onnx", None)) \
        is Forbidden


def test_a_root_reached_through_a_symlink_still_holds_its_files(tree) -> None:
    alias = tree / "alias"
    alias.symlink_to(tree / "root")
    policy = SourcePolicy.for_server(Server(), alias)
    assert _outcome(lambda: policy.check_source("onnx:model.onnx", None)) is OK
    assert _outcome(lambda: policy.check_source("onnx:link_out.onnx", None)) is Forbidden


@pytest.mark.parametrize(("message", "scrubbed"), [
    ("ONNX file /srv/a/model.onnx does not exist", "ONNX file <path>/model.onnx does not exist"),
    ("cannot import 'x': /usr/lib/python3/x.py:3", "cannot import 'x': <path>/x.py:3"),
    ("no path here: a/b.onnx", "no path here: a/b.onnx"),
    ("two: /a/b and (/c/d)", "two: <path>/b and (<path>/d)"),
])
def test_scrub_paths(message, scrubbed) -> None:
    assert scrub_paths(message) == scrubbed
    assert os.sep == "/"  # the scrubber is written for POSIX paths
