"""The ``parityserve`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parityserve.errors import ParityServeError

if TYPE_CHECKING:
    from parityserve.config import ServingConfig

__all__ = ["main"]

_EPILOG = textwrap.dedent("""\
    examples:
      parityserve start -c serving.yaml            serve the deployment described in YAML
      parityserve validate -c serving.yaml         check a deployment file without starting it
      parityserve token                            where the admin token is (--show prints it)
      parityserve top --url http://10.0.0.5:8000   a live view of running frontends (q quits)
      parityserve worker --connect tcp://10.0.0.5:5555 --model mnist-mlp --source zoo:parm-mlp
                                                   join a running frontend from another machine
                                                   (with --server-key/--client-key: CURVE keys)
      parityserve keys generate --dir keys [--name N]
                                                   CURVE keypairs for remote workers
      parityserve demo                             train a digits model, serve it, load-test it,
                                                   then slow a replica: with and without ParM
      parityserve train-parity --dataset digits --k 2 --epochs 10
                                                   train a ParM parity model for a zoo net
      parityserve profile -c serving.yaml --model M
                                                   SERF: service rate per (requests at once,
                                                   threads) and the best configuration per load
      parityserve bench overhead --data-dir DATA   frontend overhead vs in-process baselines
                                                   (needs pip install 'parityserve[bench]')
      python -m benchmarks.tail --help             the paper reproductions, from a source
                                                   checkout: tail, accuracy, selection, simulate

    Datasets and weights are read from --data-dir or $PARITYSERVE_DATA; nothing is downloaded.
    """)


def _add_start(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("start", help="serve a deployment file",
                       description="Start the HTTP frontend and the model workers described in "
                                   "a YAML file. Ctrl-C or SIGTERM stops everything cleanly.")
    p.add_argument("-c", "--config", required=True, type=Path, help="deployment YAML")
    p.add_argument("--port", type=int, help="override server.http_port")
    p.add_argument("--grpc-port", type=int, metavar="PORT",
                   help="override server.grpc_port (KServe V2 gRPC; default: beside the HTTP "
                        "port, 8001 with 8000; 0 turns gRPC off)")
    p.add_argument("--frontends", type=int, metavar="N",
                   help="override server.frontends: N frontend processes share the HTTP and "
                        "gRPC ports (SO_REUSEPORT), each with its own workers; one that dies "
                        "is restarted (default 1)")
    p.add_argument("--data-dir", type=Path, help="datasets/weights folder ($PARITYSERVE_DATA)")
    p.add_argument("--log-dir", type=Path, help="write each worker's stderr to a file here")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="run the workers as Ray actors on a cluster: 'auto' (the cluster this "
                        "host joined with `ray start`) or ray://HOST:10001; same as "
                        "launcher: {kind: ray, address: ...} in the YAML. Needs "
                        "`pip install 'parityserve[ray]'`")
    p.set_defaults(func=_cmd_start)


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a deployment file",
                       description="Parse and validate a deployment file, then print it.")
    p.add_argument("-c", "--config", required=True, type=Path)
    p.set_defaults(func=_cmd_validate)


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run one model worker that joins a frontend",
                       description="Run a model container that connects to a running frontend's "
                                   "RPC address (printed by `parityserve start`). The frontend "
                                   "must already serve a model of this name and version.")
    p.add_argument("--connect", required=True, help="tcp://HOST:PORT of the frontend")
    p.add_argument("--model", required=True, help="deployed model name to serve")
    p.add_argument("--source", required=True, help="zoo:NAME, sklearn:FILE, onnx:FILE, ...")
    p.add_argument("--weights", help="weights file for zoo/torch sources")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--options", default="{}", help="model options as JSON")
    p.add_argument("--data-dir", type=Path)
    p.add_argument("--server-key", type=Path,
                   help="the frontend's public key file (server.key from `parityserve keys "
                        "generate`); with --client-key, the channel is CURVE-encrypted")
    p.add_argument("--client-key", type=Path,
                   help="this worker's secret key file (NAME.key_secret); the frontend must "
                        "have NAME.key in its server.worker_keys_dir")
    p.add_argument("--join-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up, saying why, when no frontend completes a handshake at "
                        "--connect within this time (default: 30)")
    p.set_defaults(func=_cmd_worker)


def _add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="CURVE keys for workers started on other hosts")
    keys = p.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    g = keys.add_parser(
        "generate", help="write a keypair (the frontend's, or a worker's)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            Write NAME.key (public) and NAME.key_secret (secret, mode 0600) into --dir.
            Which file goes where:
              server.key_secret  stays on the frontend host, in server.worker_keys_dir
              server.key         copied to each worker host: `worker --server-key server.key`
              NAME.key           stays in server.worker_keys_dir: the frontend admits it
              NAME.key_secret    moved to that worker's host only: `--client-key`
            Local workers that `parityserve start` launches need none of this.
            Remove NAME.key from the folder (and restart) to shut a worker out."""),
        epilog="example: parityserve keys generate --dir keys && "
               "parityserve keys generate --dir keys --name gpu-host-1")
    g.add_argument("--dir", required=True, type=Path, help="the keys folder")
    g.add_argument("--name", default="server",
                   help="'server' (default) for the frontend's keypair, else a worker's name")
    g.add_argument("--force", action="store_true", help="overwrite an existing keypair")
    g.set_defaults(func=_cmd_keys_generate)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="train, serve and load-test a digits classifier; then show "
                       "what coding buys when a replica is slow",
                       description="Part 1: train a small classifier on scikit-learn's digits, "
                                   "serve it with 2 replicas, send open-loop Poisson load over "
                                   "HTTP, and report throughput, tail latency and accuracy. "
                                   "Part 2: slow one replica with injected bursts of background "
                                   "load and send the same load to zoo:digits-mlp without "
                                   "coding (3 plain replicas) and with ParM (2 replicas + 1 "
                                   "parity replica, parity model trained and cached on the "
                                   "first run); print their tail latencies side by side and "
                                   "how many answers were reconstructed, and how accurately.")
    p.add_argument("--queries", type=int, default=3000, help="queries in part 1")
    p.add_argument("--rate", type=float, default=300.0,
                   help="offered load in part 1, queries/s")
    p.add_argument("--slo-ms", type=float, default=None,
                   help="part 1's application SLO (default 50 ms): a query that "
                        "cannot be answered in time is shed (503) or given the default "
                        "answer; on a machine busy with other work, give it more")
    p.add_argument("--coding-queries", type=int, default=5000,
                   help="queries sent to each deployment in part 2 (at least 1,000 for the "
                        "verdict to judge p99.9; with fewer it judges p99 and says so)")
    p.add_argument("--coding-rate", type=float, default=150.0,
                   help="offered load in part 2, queries/s (it runs 6 workers: leave CPU "
                        "headroom, or the parity work competes with the queries it protects)")
    p.add_argument("--skip-coding", action="store_true",
                   help="skip part 2 (needs PyTorch for the parity model)")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache"),
                   help="trained models, configs and worker logs (reused by the next run)")
    p.add_argument("--serve", action="store_true",
                   help="keep the servers up after the reports, until Ctrl-C")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the classifier's data split, the load schedules and the bursts")
    p.set_defaults(func=_cmd_demo)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="measure the serving path on this machine (results go to "
                       "benchmarks/results/)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=_MOVED_EPILOG)
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    from parityserve.bench.overhead import add_arguments

    add_arguments(bench.add_parser(
        "overhead", help="frontend overhead vs raw call and a bare Starlette app",
        description="Open-loop Poisson load at several rates against parityserve, a bare "
                    "Starlette app calling the model in-process, and the raw predict call. "
                    "Needs the bench extra: pip install 'parityserve[bench]'."))
    from parityserve.bench import load

    load.add_arguments(bench.add_parser(
        "load", help="load any V2 (HTTP JSON/binary, gRPC) server or Clipper route: open "
                     "loop, closed loop, or a sweep for the highest rate within an SLO",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=load.__doc__,
        epilog=textwrap.dedent("""\
            examples:
              parityserve bench load http://127.0.0.1:8000 --model mnist-mlp --rate 500
              parityserve bench load 127.0.0.1:8001 --protocol grpc --model mnist-mlp \\
                  --concurrency 16 --duration 20 --json grpc.json --plot grpc.png
              parityserve bench load http://127.0.0.1:8000 --protocol clipper --app digits \\
                  --inputs x.npy --sweep --slo-ms 20
              parityserve bench load http://triton:8000 --model resnet --protocol http-json \\
                  --rate 200 --slo-ms 50      (any V2 server, not only parityserve)""")))
    for name in _MOVED_BENCHES:
        _add_moved_bench(bench, name)


# The paper reproductions left the package for the top-level benchmarks/ tree (issue 16).
_MOVED_BENCHES = ("tail", "accuracy", "selection", "simulate")
_MOVED_EPILOG = textwrap.dedent("""\
    The paper reproductions run from a source checkout, not from the installed package:
      python -m benchmarks.tail --help        ParM §6: tail latency under bursts, codecs
      python -m benchmarks.accuracy --help    ParM / ApproxIFER accuracy vs the papers
      python -m benchmarks.selection --help   Clipper Figs 8-9: bandits, stragglers
      python -m benchmarks.simulate --help    simulated tails at 18 to 1,000 instances
    or make bench-tail, bench-accuracy, bench-selection, bench-simulate (ARGS='...').""")


def _add_moved_bench(bench: argparse._SubParsersAction[argparse.ArgumentParser],
                     name: str) -> None:
    """A hidden ``bench NAME`` that takes any arguments (--help too) and says where it went."""
    # No help= keeps it out of the listing; a prefix no argument starts with makes every
    # argument, --help included, a plain string, so the stub never fails before it can explain.
    p = bench.add_parser(name, add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs="*")
    p.set_defaults(func=lambda args: _moved_bench(name, args.args))


def _moved_bench(name: str, rest: list[str]) -> int:
    command = shlex.join(["python", "-m", f"benchmarks.{name}", *rest])
    raise ParityServeError(f"`parityserve bench {name}` moved out of the package: run "
                           f"`{command}` from the project root, or `make bench-{name}`")


def _add_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from parityserve.bench import profiler

    profiler.add_arguments(sub.add_parser(
        "profile", help="measure a model's service rate per parallelism (SERF) and print the "
                        "best configuration per load",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=profiler.__doc__,
        epilog=textwrap.dedent("""\
            examples:
              parityserve profile -c serving.yaml --model resnet20 --data-dir ../shared/data
              parityserve profile -c serving.yaml --model mlp --oversubscribe --exhaustive
              parityserve profile --url http://127.0.0.1:8000 --model mlp --intra 1 -o p.json
            The JSON holds every measurement, {intra: [mu_1..mu_n]} and the reference table.""")))


def _add_train_parity(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "train-parity", help="train a ParM parity model for a deployed zoo model",
        description="Train a parity model (ParM): it learns the sum (or another linear "
                    "combination) of the deployed model's outputs on k encoded queries, so a "
                    "slow or lost prediction can be rebuilt. Reports degraded-mode accuracy A_d "
                    "each epoch, checkpoints to --out, and writes deployable .npz weights plus "
                    "a JSON sidecar next to it.")
    p.add_argument("--dataset", required=True,
                   choices=["mnist", "fashion-mnist", "cifar10", "digits"])
    p.add_argument("--model", help="zoo:parm-mlp, zoo:lenet5, zoo:resnet20..56 or "
                   "zoo:digits-mlp (default: the dataset's usual net)")
    p.add_argument("--weights", help="deployed weights (.npz/.pt); default: the published ones "
                   "(digits: a DigitsMLP trained and cached under --cache-dir)")
    p.add_argument("--k", type=int, default=2, help="queries per parity group")
    p.add_argument("--r", type=int, default=1, help="parity models (linear-code rows)")
    p.add_argument("--encoder", default="addition", help="addition or concat (k = 2 or 4)")
    p.add_argument("--epochs", type=int, default=10, help="total epochs (also with --resume)")
    p.add_argument("--out", help="checkpoint path (default .cache/parity/NAME.pt)")
    p.add_argument("--resume", action="store_true", help="continue from the --out checkpoint")
    p.add_argument("--init", default="deployed", help="deployed (start from its weights) or "
                   "scratch")
    p.add_argument("--batch-size", type=int, help="default 64 for k=2, else 32")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--samples-per-epoch", type=int, help="default: the training-set size")
    p.add_argument("--train-limit", type=int, help="use only N training images")
    p.add_argument("--val-limit", type=int, help="use only N test images")
    p.add_argument("--data-dir", type=Path, help="datasets/weights folder ($PARITYSERVE_DATA)")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache"))
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="tqdm progress bar (default: only on a terminal)")
    p.set_defaults(func=_cmd_train_parity)


def _server_with(server: Any, ports: dict[str, int]) -> Any:
    """``server`` with ``ports`` changed, validated like the YAML (python-mode dump: a
    SecretStr token stays a secret, not its masked text)."""
    from pydantic import ValidationError

    from parityserve.config import Server

    try:
        return Server.model_validate({**server.model_dump(), **ports})
    except ValidationError as exc:
        problems = "; ".join(f"server.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in exc.errors())
        raise ParityServeError(f"command line: {problems}") from None


def _with_ray(config: ServingConfig, address: str) -> ServingConfig:
    """``--ray-address``: the workers run as Ray actors on the cluster at ``address``."""
    from parityserve.config import LauncherConfig

    return config.model_copy(update={"launcher": LauncherConfig(kind="ray", address=address)})


def _cmd_start(args: argparse.Namespace) -> int:
    from parityserve.config import load_config
    from parityserve.runtime.server import resolve_admin_token, serve

    config = load_config(args.config)
    ports = {k: v for k, v in (("http_port", args.port), ("grpc_port", args.grpc_port),
                               ("frontends", args.frontends)) if v is not None}
    if ports:  # validated, so a bad port gets the same clear error as in YAML
        config = config.model_copy(update={"server": _server_with(config.server, ports)})
    if args.ray_address:
        config = _with_ray(config, args.ray_address)
    data_dir = _data_dir(args.data_dir)
    base_dir = args.config.resolve().parent
    token = resolve_admin_token(config, base_dir)  # before serving: say where it lives
    print(token.where() if token else "admin token: OFF (require_admin_token: false; "
          "loopback only)", flush=True)
    serve(config, base_dir=base_dir, data_dir=data_dir, token=token,
          log_dir=args.log_dir, on_ready=lambda urls: print(urls.describe(config), flush=True))
    print("parityserve stopped; all workers shut down.", flush=True)
    return 0


def _add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "token", help="where the admin token lives (--show prints it, --rotate replaces it)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            The /admin routes need 'Authorization: Bearer <token>'. The token is, in order:
            server.admin_token in the config, $PARITYSERVE_ADMIN_TOKEN, or the token file
            (server.admin_token_file, else $PARITYSERVE_HOME/admin-token, the home
            defaulting to ~/.parityserve). `parityserve start` creates the file (mode 0600)
            when there is none; parityserve.Client reads it from the same place."""),
        epilog=textwrap.dedent("""\
            examples:
              parityserve token                     say where the token is
              curl -H "Authorization: Bearer $(parityserve token --show)" \\
                   http://127.0.0.1:8000/admin/state
              parityserve token --rotate            new token; restart the server to use it"""))
    p.add_argument("-c", "--config", type=Path, help="deployment YAML (for its token settings)")
    p.add_argument("--show", action="store_true", help="print the token itself (for scripts)")
    p.add_argument("--rotate", action="store_true",
                   help="write a new token file (a running server keeps the old one until "
                        "restarted)")
    p.set_defaults(func=_cmd_token)


def _cmd_token(args: argparse.Namespace) -> int:
    from parityserve.config import Server, load_config
    from parityserve.runtime.frontend import auth

    server = load_config(args.config).server if args.config else Server()
    base_dir = args.config.resolve().parent if args.config else None
    if args.rotate:
        path = auth.token_file(server, base_dir)
        token = auth.write_new_token(path, replace=True)
        print(f"admin token: new token written to {path}; a running server keeps the old one "
              "until it is restarted", file=sys.stderr if args.show else sys.stdout)
        if args.show:
            print(token)
        return 0
    found = auth.resolve_token(server, base_dir, create=False)
    if found is None:
        print(f"no admin token yet: `parityserve start` will create "
              f"{auth.token_file(server, base_dir)}", file=sys.stderr)
        return 1
    print(found.token if args.show else found.where())
    return 0


def _add_top(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "top", help="a live view of running frontends: rates, p50/p99 against the SLO, "
                    "replicas, failovers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            Reads each frontend's /metrics and /admin/state every --interval seconds and
            shows, per model: requests/s, p50 and p99 of the last interval against its SLO
            (p99 in red past it), replicas ready/all, defaults and rebuilt (reconstructed)
            answers per second and the parallelism the controller runs; per graph:
            requests/s, p50/p99, durable lag, backups synced and failovers in the last
            minute (counted as parityserve_graph_failovers_total grows between scrapes,
            since top started when it has run for less). The admin token is found as
            parityserve.Client finds it: $PARITYSERVE_ADMIN_TOKEN, then the token file
            (see `parityserve token`). A frontend that cannot be read is one line saying
            why. q quits (Ctrl-C when stdin is not a terminal)."""),
        epilog=textwrap.dedent("""\
            examples:
              parityserve top                                  the server on 127.0.0.1:8000
              parityserve top --url http://10.0.0.5:8000 --url http://10.0.0.6:8000
                                                               two frontends, one view
              parityserve top --url http://h:8000,http://h:9000
                                                               admin routes on their own
                                                               listener (server.admin_port)
              parityserve top --once --interval 5 > frame.txt  one frame for a script: two
                                                               scrapes 5 s apart, then exit
                                                               (1 if a frontend was unread)"""))
    p.add_argument("--url", action="append", metavar="URL",
                   help="a frontend, SERVE_URL or SERVE_URL,ADMIN_URL; repeat for several "
                        "(default http://127.0.0.1:8000)")
    p.add_argument("--interval", type=_positive_seconds, default=2.0, metavar="SECONDS",
                   help="seconds between scrapes; rates are over this window (default 2)")
    p.add_argument("--once", action="store_true",
                   help="print one frame and exit: two scrapes --interval apart, so the rates "
                        "exist")
    p.set_defaults(func=_cmd_top)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600: {text}")
    return value


def _cmd_top(args: argparse.Namespace) -> int:
    from parityserve.top import run

    return run(args.url or ["http://127.0.0.1:8000"], interval_s=args.interval, once=args.once)


def _cmd_validate(args: argparse.Namespace) -> int:
    from parityserve.config import load_config
    from parityserve.models.extras import check_extras, needed_extras
    from parityserve.runtime.graphs.registry import stateful_models
    from parityserve.runtime.serving.admin_ops import check_zoo_sources

    config = load_config(args.config)
    check_extras(needed_extras(config), where=str(args.config))
    stateful = stateful_models(config)
    for model in config.models:  # what every worker would refuse to load, said now
        if model.name not in stateful:
            check_zoo_sources(model)
    schedulers = _check_schedulers(config, Path(args.config).parent, args.config)
    print(f"{args.config}: ok — {len(config.models)} models, "
          f"{len(config.applications)} applications")
    for model in config.models:
        print(f"  model {model.name} v{model.version}: {model.source} x{model.replicas}")
        if model.name in schedulers:
            print(f"  scheduler: {schedulers[model.name]}")
    for app in config.applications:
        print(f"  app {app.name}: {list(app.models)}, SLO {app.slo_ms:g} ms")
    return 0


def _check_schedulers(config: Any, folder: Path, where: str) -> dict[str, str]:
    """Each model's scheduler policy, built as `start` builds it (its profile read and checked
    against the model), so that validate catches what start would refuse."""
    from parityserve.errors import ConfigError
    from parityserve.runtime.fleet.parallelism import build_policy

    found = {}
    for model in config.models:
        if model.scheduler is not None:
            try:
                build_policy(model.scheduler, model, folder, os.cpu_count() or 1)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            found[model.name] = (f"{model.scheduler.policy}, every "
                                 f"{model.scheduler.period_s:g} s")
    return found


def _cmd_keys_generate(args: argparse.Namespace) -> int:
    from parityserve.runtime.workers.keys import generate

    if not args.name or "/" in args.name or args.name.startswith("."):
        raise ParityServeError(f"--name must be a plain file name, not {args.name!r}")
    existing = args.dir / f"{args.name}.key_secret"
    if existing.exists() and not args.force:
        raise ParityServeError(f"{existing} exists; pass --force to replace it")
    public, secret = generate(args.dir, args.name)
    print(f"wrote {public} (public) and {secret} (secret, 0600)")
    return 0


def _worker_keys(args: argparse.Namespace) -> Any:
    """CURVE keys from --server-key/--client-key; both or neither."""
    if (args.server_key is None) != (args.client_key is None):
        raise ParityServeError("--server-key and --client-key go together")
    if args.server_key is None:
        return None
    from parityserve.runtime.workers.keys import ClientKeys

    return ClientKeys.from_files(args.server_key, args.client_key)


def _cmd_worker(args: argparse.Namespace) -> int:
    import os
    import secrets
    import socket

    import orjson

    from parityserve.runtime.workers.worker import WorkerSpec, run_worker

    try:
        options = orjson.loads(args.options)
    except orjson.JSONDecodeError as exc:
        raise ParityServeError(f"--options is not valid JSON: {exc}") from exc
    if not args.join_timeout > 0:
        raise ParityServeError(f"--join-timeout must be positive, got {args.join_timeout}")
    data_dir = _data_dir(args.data_dir)
    keys = _worker_keys(args)
    # Random, so that no other peer can take this worker's id before it connects.
    rid = (f"{args.model}/v{args.version}/ext-{socket.gethostname()}-{os.getpid()}-"
           f"{secrets.token_hex(8)}")
    spec = WorkerSpec(rid, args.model, args.version, args.source, weights=args.weights,
                      options=options, threads=args.threads, base_dir=os.getcwd(),
                      data_dir=str(data_dir) if data_dir else None)
    # SIGTERM unwinds like Ctrl-C, so the worker says goodbye and the frontend forgets it now.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"parityserve worker {rid}: loading {args.source} as model {args.model!r} "
          f"v{args.version}, then joining {args.connect}", file=sys.stderr, flush=True)
    try:
        return run_worker(spec, args.connect, keys, join_timeout_s=args.join_timeout)
    finally:  # leaving anyway: a late SIGTERM must not raise inside interpreter shutdown
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _cmd_demo(args: argparse.Namespace) -> int:
    from parityserve.demo import DEMO_SLO_MS, run_demo

    for flag, value in (("--queries", args.queries), ("--coding-queries", args.coding_queries)):
        if value < 1:
            raise ParityServeError(f"{flag} must be at least 1, got {value}")
    slo_ms = DEMO_SLO_MS if args.slo_ms is None else args.slo_ms
    if not slo_ms > 0:  # (NaN too)
        raise ParityServeError(f"--slo-ms must be a positive number of ms, got {slo_ms:g}")
    return run_demo(queries=args.queries, rate=args.rate, slo_ms=slo_ms,
                    cache_dir=args.cache_dir,
                    keep_serving=args.serve, seed=args.seed, coding=not args.skip_coding,
                    coding_queries=args.coding_queries, coding_rate=args.coding_rate)


def _cmd_train_parity(args: argparse.Namespace) -> int:
    try:
        from parityserve.training import TrainConfig, train_parity
    except ImportError as exc:
        raise ParityServeError(
            f"train-parity needs PyTorch: pip install 'parityserve[torch]' ({exc})") from exc

    data_dir = _data_dir(args.data_dir)
    config = TrainConfig(
        dataset=args.dataset, model=args.model, weights=args.weights, k=args.k, r=args.r,
        encoder=args.encoder, epochs=args.epochs, out=args.out, resume=args.resume,
        data_dir=str(data_dir) if data_dir else None, cache_dir=str(args.cache_dir),
        device=args.device, seed=args.seed, init=args.init, batch_size=args.batch_size,
        lr=args.lr, samples_per_epoch=args.samples_per_epoch, train_limit=args.train_limit,
        val_limit=args.val_limit, threads=args.threads, progress=args.progress)
    train_parity(config, log=lambda line: print(line, flush=True))
    return 0


def _data_dir(explicit: Path | None) -> Path | None:
    import os

    chosen = explicit or (Path(os.environ["PARITYSERVE_DATA"])
                          if os.environ.get("PARITYSERVE_DATA") else None)
    return chosen.resolve() if chosen else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parityserve", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Prediction serving that answers on time, even when model instances are "
                    "slow, fail or lie.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_start, _add_validate, _add_worker, _add_keys, _add_demo, _add_bench,
                _add_profile, _add_train_parity, _add_token, _add_top):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command in ("bench", "demo", "train-parity", "profile"):
        # SIGTERM unwinds like Ctrl-C, so the servers these commands started are stopped too.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.func(args))
    except ParityServeError as exc:
        print(f"parityserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
