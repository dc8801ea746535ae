"""``python -m benchmarks.accuracy``: ParM and ApproxIFER accuracy on real data and real models.

For each dataset and deployed model it measures, over several random groupings of the test
set (mean and spread):

* ``parm``: degraded-mode accuracy A_d of ParM parity models (addition k = 2, 3, 4, 8, 12 and
  concat k = 2, 4), trained here with the section 4.4 trainer and cached under
  ``<cache-dir>/bench-accuracy/`` keyed by their configuration; overall accuracy A_o and the
  default-prediction lower bound follow from A_a and A_d.
* ``approxifer``: Berrut-coded inference with S stragglers (K = 8, 10, 12; S = 1, 2, 3).
* ``byzantine``: E corrupted workers with Gaussian noise sigma (S = 0), decoded with the
  error locator.
* ``systematic``: systematic Berrut (K uncoded + S coded workers).
* ``cifar``: the approxifer/byzantine/systematic parts also on CIFAR-10 with ResNet-20 (the
  shared data's lossy JPEG copy; ParM there only with ``--cifar-parm``).

Parts run separately (``--parts``) and their cells are merged into one results file
(``accuracy.json``/``.md``; ``accuracy-quick`` with ``--quick``), with every command that
contributed. See ``accuracy_eval.py`` for the measurements and ``accuracy_report.py`` for
the tables, claims and plots.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import _cli
from benchmarks import accuracy_eval as ev
from benchmarks.accuracy_report import (
    cell_id,
    markdown,
    merge_cells,
    plot_approxifer,
    plot_overall,
)
from benchmarks.report import command_line, write_results
from parityserve.core.coding import BerrutCode, SystematicBerrut, minimum_workers

__all__ = ["add_arguments", "build_parser", "main", "run"]

PARTS = ("approxifer", "byzantine", "systematic", "parm", "cifar")
_MODELS = {"mlp": "parm-mlp", "lenet5": "lenet5", "resnet20": "resnet20"}
_DEFAULT_PARM = "2:addition,3:addition,4:addition,2:concat,4:concat,8:addition,12:addition"
Log = Callable[[str], None]


def _ints(text: str) -> list[int]:
    return [int(t) for t in str(text).split(",") if t.strip()]


def _floats(text: str) -> list[float]:
    return [float(t) for t in str(text).split(",") if t.strip()]


def _words(text: str) -> list[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--parts", default="approxifer,byzantine,systematic,parm",
                   help=f"comma-separated, from {', '.join(PARTS)}; 'cifar' adds CIFAR-10 "
                        "(ResNet-20) to the approxifer/byzantine/systematic parts")
    p.add_argument("--datasets", default="mnist,fashion-mnist",
                   help="MNIST-shaped datasets: mnist, fashion-mnist")
    p.add_argument("--models", default="mlp,lenet5",
                   help="mlp (the ParM authors' published base MLP) and/or lenet5 (trained "
                        "here and cached)")
    p.add_argument("--groupings", type=int, default=3,
                   help="random groupings of the test set per cell (at least 3)")
    p.add_argument("--test-limit", type=int, help="use N random test samples (default all)")
    p.add_argument("--cifar-test-limit", type=int, default=2000,
                   help="CIFAR-10 test samples (ResNet-20 costs ~2 ms per coded query)")
    p.add_argument("--K", dest="ks", default="8,10,12", help="ApproxIFER/systematic K values")
    p.add_argument("--S", dest="ss", default="1,2,3", help="straggler counts")
    p.add_argument("--byz-K", dest="byz_ks", default="12", help="K for the Byzantine cells")
    p.add_argument("--E", dest="es", default="1,2,3", help="Byzantine worker counts")
    p.add_argument("--sigma", dest="sigmas", default="1,10,100", help="noise scales")
    p.add_argument("--extra-workers", type=int, default=0, metavar="N",
                   help="ApproxIFER and Byzantine cells: N Berrut workers over the code's "
                        "minimum (K + S, or 2(K + E)); denser nodes decode more accurately. "
                        "Cells with different N are kept side by side")
    p.add_argument("--systematic-decoder", default="interpolate",
                   choices=("interpolate", "subtract"),
                   help="systematic cells: rebuild a missing answer by Berrut interpolation "
                        "(the default) or by subtracting the arrived originals from the coded "
                        "results (ParM's decoder; exact for affine models). Kept side by side")
    p.add_argument("--parm-codes", default=_DEFAULT_PARM,
                   help="k:encoder list of ParM parity models")
    p.add_argument("--epochs", type=int, default=3, help="parity-model training epochs")
    p.add_argument("--samples-per-epoch", type=int,
                   help="parity training groups per epoch (default: the training set)")
    p.add_argument("--lenet-epochs", type=int, default=3, help="LeNet-5 base-model epochs")
    p.add_argument("--cifar-parm", action="store_true",
                   help="also train a k=2 addition parity ResNet-20 (slow on a CPU)")
    p.add_argument("--cifar-parm-samples", type=int, default=10_000,
                   help="CIFAR parity training groups per epoch")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache"))
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--name", help="results name (default accuracy, or accuracy-quick)")
    p.add_argument("--fresh", action="store_true",
                   help="start a new results file instead of merging into the existing one")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite the markdown and plots from the existing JSON; run nothing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2000 test samples, 3 groupings, 1 short epoch per model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from parityserve.models.datasets import resolve_data_dir

    torch.set_num_threads(args.threads)
    if args.quick:
        args.test_limit = args.test_limit or 2000
        args.cifar_test_limit = min(args.cifar_test_limit, 500)
        args.epochs, args.lenet_epochs = 1, 1
        args.samples_per_epoch = args.samples_per_epoch or 10_000
        args.cifar_parm_samples = min(args.cifar_parm_samples, 1000)
    if args.extra_workers < 0:
        raise SystemExit(f"--extra-workers must be >= 0, got {args.extra_workers}")
    if args.groupings < 3:
        raise SystemExit("--groupings must be at least 3 (every cell reports a spread)")
    parts = set(_words(args.parts))
    if parts - set(PARTS):
        raise SystemExit(f"--parts: unknown {sorted(parts - set(PARTS))}; use {PARTS}")
    name = args.name or ("accuracy-quick" if args.quick else "accuracy")
    doc = _load_previous(args.results_dir / f"{name}.json", fresh=args.fresh)
    if args.render_only:
        if not doc["runs"]:
            raise SystemExit(f"--render-only: no {name}.json with results in {args.results_dir}")
        _write(doc, args, name, parts, 0.0, record=False)
        return 0
    data_dir = resolve_data_dir(args.data_dir)
    started = time.perf_counter()
    mnist_parts = parts - {"cifar"}
    setups = [(d, m, mnist_parts) for d in _words(args.datasets) for m in _words(args.models)
              if mnist_parts]
    if "cifar" in parts:  # alone: every coded part on CIFAR-10; else the parts named
        setups.append(("cifar10", "resnet20", mnist_parts or {"approxifer", "byzantine",
                                                              "systematic"}))
    new_cells: list[dict[str, Any]] = []
    new_bases: dict[str, Any] = {}
    for index, (dataset, model, todo) in enumerate(setups):
        bench = _Setup(args, dataset, model, data_dir)
        new_bases[f"{dataset}|{model}"] = bench.base
        new_cells += bench.run(todo, log=_log)
        # Write after every setup, so a long run that is stopped keeps what it measured. The
        # file is read again first: parts running side by side each add their own cells.
        doc = _load_previous(args.results_dir / f"{name}.json",
                             fresh=args.fresh and index == 0)
        doc["bases"].update(new_bases)
        doc["cells"] = merge_cells(doc["cells"], new_cells)
        _write(doc, args, name, parts, time.perf_counter() - started)
    return 0


def _log(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line)


def _load_previous(path: Path, *, fresh: bool) -> dict[str, Any]:
    if path.is_file() and not fresh:
        old = orjson.loads(path.read_bytes())
        return {"cells": old.get("cells", []), "bases": old.get("bases", {}),
                "runs": old.get("runs", [])}
    return {"cells": [], "bases": {}, "runs": []}


def _write(doc: dict[str, Any], args: argparse.Namespace, name: str, parts: set[str],
           seconds: float, *, record: bool = True) -> None:
    if record:  # one entry per distinct command; a re-run replaces its old entry
        command = command_line()
        runs = [r for r in doc["runs"] if r.get("command") != command]
        doc["runs"] = [*runs, {"command": command, "parts": sorted(parts),
                               "seconds": round(seconds), "settings": _settings(args)}]
    payload = {"quick": bool(args.quick or name.endswith("-quick")), "bases": doc["bases"],
               "cells": doc["cells"], "runs": doc["runs"]}
    commands = "\n".join(r["command"] for r in doc["runs"])
    plots = {"overall": args.results_dir / f"{name}-overall.png",
             "approxifer": args.results_dir / f"{name}-approxifer.png"}
    payload["plots"] = {k: v.name for k, v in plot_overall_and_approxifer(payload, plots).items()}
    paths = write_results(name, payload, results_dir=args.results_dir,
                          markdown=markdown(payload), command=commands)
    _log(f"wrote {paths['json']} and {paths['md']}")


def plot_overall_and_approxifer(payload: dict[str, Any],
                                plots: dict[str, Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if plot_overall(payload, plots["overall"]) is not None:
        out["overall"] = plots["overall"]
    if plot_approxifer(payload, plots["approxifer"]) is not None:
        out["approxifer"] = plots["approxifer"]
    return out


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keep = ("groupings", "test_limit", "cifar_test_limit", "epochs", "samples_per_epoch",
            "lenet_epochs", "cifar_parm", "cifar_parm_samples", "seed", "quick", "threads",
            "extra_workers", "systematic_decoder")
    return {k: getattr(args, k) for k in keep}


# --- one dataset and deployed model -----------------------------------------------------------


class _Setup:
    """The test data, the deployed model and its outputs for one (dataset, model)."""

    def __init__(self, args: argparse.Namespace, dataset: str, model: str,
                 data_dir: Path) -> None:
        self.args, self.dataset, self.model, self.data_dir = args, dataset, model, data_dir
        self.extra = int(args.extra_workers)
        self.zoo = _MODELS[model]
        self.cache = Path(args.cache_dir) / "bench-accuracy"
        limit = args.cifar_test_limit if dataset == "cifar10" else args.test_limit
        self.x, self.y = _test_data(dataset, data_dir, limit, args.seed)
        self.weights = self._deployed_weights()
        self.net = _load_net(self.zoo, self.weights)
        self.outputs = self.predict(self.x)
        self.a_available = ev.accuracy(self.outputs, self.y)
        cls, rate = ev.majority_rate(self.y, 10)
        self.base = {"dataset": dataset, "model": model, "zoo": f"zoo:{self.zoo}",
                     "weights": _short(self.weights), "test_samples": len(self.y),
                     "a_available": self.a_available, "majority_class": cls,
                     "majority_rate": rate, "lossy": dataset == "cifar10"}
        _log(f"{dataset} {model}: A_a {self.a_available:.4f} on {len(self.y)} test samples "
             f"({_short(self.weights)})")

    def predict(self, batch: np.ndarray) -> np.ndarray:
        import torch

        outs = []
        with torch.inference_mode():
            for i in range(0, len(batch), 1024):
                chunk = torch.from_numpy(np.ascontiguousarray(batch[i:i + 1024],
                                                              dtype=np.float32))
                outs.append(self.net(chunk).float().numpy())
        return np.concatenate(outs).astype(np.float64)

    def _deployed_weights(self) -> Path:
        from parityserve.models.datasets import weights_file

        if self.model == "mlp":
            return weights_file(f"parm-{self.dataset}-base-mlp.npz", self.data_dir)
        if self.model == "resnet20":
            return weights_file("cifar10-resnet20.npz", self.data_dir)
        return _train_lenet(self.dataset, self.data_dir, self.cache, self.args.lenet_epochs,
                            self.args.seed)

    def _rngs(self, *key: Any) -> list[np.random.Generator]:
        seq = np.random.SeedSequence([self.args.seed, *_key_ints(self.dataset, self.model,
                                                                 *key)])
        return [np.random.default_rng(s) for s in seq.spawn(self.args.groupings)]

    def _cell(self, kind: str, trials: list[float], **fields: Any) -> dict[str, Any]:
        cell = {"kind": kind, "dataset": self.dataset, "model": self.model, **fields,
                "a_available": self.a_available, "test_samples": len(self.y),
                "trials": trials, "stats": ev.mean_spread(trials)}
        cell["id"] = cell_id(cell)
        return cell

    def run(self, parts: set[str], *, log: Log) -> list[dict[str, Any]]:
        cells: list[dict[str, Any]] = []
        cifar = self.dataset == "cifar10"
        if "approxifer" in parts:
            cells += self._approxifer()
        if "byzantine" in parts:
            cells += self._byzantine()
        if "systematic" in parts:
            cells += self._systematic()
        if "parm" in parts and (not cifar or self.args.cifar_parm):
            cells += self._parm(log)
        return cells

    # --- ApproxIFER ---------------------------------------------------------------------

    def _approxifer(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        cells = []
        combos = [(k, s) for k in _ints(self.args.ks) for s in _ints(self.args.ss)]
        for k, s in tqdm(combos, desc=f"{self.dataset} {self.model} approxifer", leave=False):
            code = BerrutCode(k, s, workers=minimum_workers(k, s) + self.extra)
            trials: dict[str, list[float]] = {"logits": [], "probs": []}
            for rng in self._rngs("approxifer", k, s):
                groups = ev.groupings(len(self.y), k, 1, rng)[0]
                outs = ev.coded_outputs(self.predict, self.x, groups, code)
                for space, values in trials.items():
                    values.append(ev.straggler_trial(code, outs, self.y[groups], s, rng,
                                                     space=space))
            cells.append(self._cell("approxifer", trials["logits"], K=k, S=s, E=0,
                                    workers=code.n_workers, extra_workers=self.extra,
                                    probs=ev.mean_spread(trials["probs"]),
                                    probs_trials=trials["probs"]))
        return cells

    def _byzantine(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        sigmas = _floats(self.args.sigmas)
        cells = []
        combos = [(k, e) for k in _ints(self.args.byz_ks) for e in _ints(self.args.es)]
        for k, e in tqdm(combos, desc=f"{self.dataset} {self.model} byzantine", leave=False):
            code = BerrutCode(k, 0, e, workers=minimum_workers(k, 0, e) + self.extra)
            trials: dict[float, list[ev.ByzantineTrial]] = {s: [] for s in sigmas}
            for rng in self._rngs("byzantine", k, e):
                groups = ev.groupings(len(self.y), k, 1, rng)[0]
                outs = ev.coded_outputs(self.predict, self.x, groups, code)
                for sigma in sigmas:  # the same coded outputs, fresh corruptions per sigma
                    trials[sigma].append(ev.byzantine_trial(code, outs, self.y[groups], sigma,
                                                            rng))
            for sigma, got in trials.items():
                located = [t.located for t in got]
                cells.append(self._cell("byzantine", [t.accuracy for t in got], K=k, S=0, E=e,
                                        sigma=sigma, workers=code.n_workers,
                                        extra_workers=self.extra,
                                        located=ev.mean_spread(located)))
        return cells

    def _systematic(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        cells = []
        combos = [(k, s) for k in _ints(self.args.ks) for s in _ints(self.args.ss)]
        for k, s in tqdm(combos, desc=f"{self.dataset} {self.model} systematic", leave=False):
            code = SystematicBerrut(k, s, decoder=self.args.systematic_decoder)
            degraded: list[float] = []
            group: list[float] = []
            rebuilt = 0
            for rng in self._rngs("systematic", k, s):
                groups = ev.groupings(len(self.y), k, 1, rng)[0]
                outs = ev.systematic_outputs(self.predict, self.x, groups, code)
                got = ev.systematic_trial(code, outs, self.y[groups], rng)
                group.append(got["group"])
                rebuilt += got["rebuilt"]
                if got["degraded"] is not None:
                    degraded.append(got["degraded"])
            cells.append(self._cell("systematic", degraded or [float("nan")], K=k, S=s, E=0,
                                    workers=code.n_workers, group=ev.mean_spread(group),
                                    rebuilt=rebuilt, decoder=code.decoder))
        return cells

    # --- ParM ---------------------------------------------------------------------------

    def _parm(self, log: Log) -> list[dict[str, Any]]:
        codes = [(int(k), enc) for k, enc in (c.split(":") for c in _words(self.args.parm_codes))]
        if self.dataset == "cifar10":
            codes = [(2, "addition")]
        cells = []
        for k, encoder in codes:
            trained = self._parity_model(k, encoder, log)
            parity_net = _load_net(self.zoo, Path(trained["weights"][0]))
            trials = []
            for rng in self._rngs("parm", k, encoder):
                groups = ev.groupings(len(self.y), k, 1, rng)[0]
                queries = ev.parity_queries(self.x, groups, encoder)
                parity_out = _predict_with(parity_net, queries)
                trials.append(ev.parm_degraded(self.outputs, parity_out, groups, self.y,
                                               encoder, rng))
            cells.append(self._cell("parm", trials, K=k, encoder=encoder,
                                    epochs=trained["epochs"],
                                    train_seconds=trained.get("train_seconds"),
                                    trainer_a_d=trained.get("accuracy_degraded"),
                                    parity_weights=_short(Path(trained["weights"][0]))))
            log(f"{self.dataset} {self.model} ParM k={k} {encoder}: A_d "
                f"{np.mean(trials):.4f} (A_a {self.a_available:.4f})")
        return cells

    def _parity_model(self, k: int, encoder: str, log: Log) -> dict[str, Any]:
        """Train (or reuse from the cache) the parity model for this code; its sidecar."""
        from parityserve.training import TrainConfig, train_parity

        args = self.args
        samples = args.cifar_parm_samples if self.dataset == "cifar10" else args.samples_per_epoch
        key = {"dataset": self.dataset, "model": self.zoo, "weights": str(self.weights),
               "k": k, "encoder": encoder, "epochs": args.epochs, "samples": samples,
               "seed": args.seed}
        digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
        out = self.cache / "parity" / f"{self.zoo}-{self.dataset}-k{k}-{encoder}-{digest}.pt"
        sidecar = out.with_suffix(".json")
        if sidecar.is_file():
            info: dict[str, Any] = json.loads(sidecar.read_text())
            log(f"cached parity model {out.name}")
            return info
        log(f"training parity model {out.name} ({args.epochs} epochs)")
        config = TrainConfig(dataset=self.dataset, model=f"zoo:{self.zoo}",
                             weights=str(self.weights), k=k, encoder=encoder,
                             epochs=args.epochs, out=str(out), data_dir=str(self.data_dir),
                             cache_dir=str(args.cache_dir), device="cpu", seed=args.seed,
                             samples_per_epoch=samples, val_limit=2000,
                             threads=args.threads)
        t0 = time.perf_counter()
        train_parity(config, log=log)
        info = json.loads(sidecar.read_text())
        info["train_seconds"] = round(time.perf_counter() - t0, 1)
        sidecar.write_text(json.dumps(info, indent=2) + "\n")
        return info


# --- helpers --------------------------------------------------------------------------------


def _key_ints(*key: Any) -> list[int]:
    digest = hashlib.sha1(repr(key).encode()).digest()
    return [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]


def _short(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return path.name


def _test_data(dataset: str, data_dir: Path, limit: int | None,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    from parityserve.models import datasets

    if dataset == "cifar10":
        x, y = datasets.load_cifar10("test", data_dir=data_dir)
    elif dataset in ("mnist", "fashion-mnist"):
        x, y = datasets.load_mnist("test", kind=dataset,  # type: ignore[arg-type]
                                   data_dir=data_dir)
    else:
        raise SystemExit(f"unknown dataset {dataset!r}")
    if limit is not None and limit < len(y):
        pick = np.sort(np.random.default_rng(seed).permutation(len(y))[:limit])
        x, y = x[pick], y[pick]
    return x, y


def _load_net(zoo: str, weights: Path) -> Any:
    from parityserve.training.deployed import frozen_net

    return frozen_net(zoo, weights)


def _predict_with(net: Any, batch: np.ndarray) -> np.ndarray:
    import torch

    outs = []
    with torch.inference_mode():
        for i in range(0, len(batch), 1024):
            chunk = torch.from_numpy(np.ascontiguousarray(batch[i:i + 1024], dtype=np.float32))
            outs.append(net(chunk).float().numpy())
    return np.concatenate(outs).astype(np.float64)


def _train_lenet(dataset: str, data_dir: Path, cache: Path, epochs: int, seed: int) -> Path:
    """Train (or reuse) a LeNet-5 base model on the full training set; cached as .npz."""
    import torch
    from torch import nn

    from parityserve.models import datasets
    from parityserve.training.deployed import build_net, save_npz

    path = cache / f"lenet5-{dataset}-e{epochs}-s{seed}.npz"
    if path.is_file():
        return path
    _log(f"training the LeNet-5 base model on {dataset} ({epochs} epochs) -> {path}")
    x, y = datasets.load_mnist("train", kind=dataset, data_dir=data_dir)  # type: ignore[arg-type]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    net = build_net("lenet5", seed=seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    from tqdm import tqdm

    for epoch in range(epochs):
        batches = torch.randperm(len(xt), generator=generator).split(128)
        for idx in tqdm(batches, desc=f"lenet5 {dataset} epoch {epoch + 1}/{epochs}",
                        leave=False):
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    save_npz(net.state_dict(), path)
    return path

# ---- python -m benchmarks.accuracy ---------------------------------------------------------------

DESCRIPTION = ("Degraded-mode, overall and available accuracy of ParM parity models "
               "(trained here, cached) and of ApproxIFER's Berrut codes with stragglers, "
               "Byzantine workers and the systematic mode, on MNIST, Fashion-MNIST and "
               "(lossy) CIFAR-10, over random groupings of the test set, beside the "
               "papers' claims.")
EXAMPLES = (
    ('python -m benchmarks.accuracy --quick',
     'smoke test: short training, 2,000 test samples'),
    ('python -m benchmarks.accuracy --parts approxifer,byzantine --K 8 --extra-workers 8',
     'denser Berrut nodes, merged into accuracy.json'),
    ('python -m benchmarks.accuracy --render-only',
     'rewrite the tables and plots from the JSON'),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("accuracy", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
