"""Warm a new Spark Connect server before it serves the platform: ``ngsi-assets spark warm-up``.

A new server's JVM compiles Spark's code as the first runs use it: the main job over 1,000
notifications took 47.5 s on a new server, 21.4 s on its second run and 14-15 s from its eighth on,
its JIT compilers using 33.7 s of CPU in the first run and about 4 s from the eighth on (BENCHMARKS.md,
"The main job"). Under traffic that first run is an increment the receiver's notifications wait for,
and while it runs the next increment grows: a new server's first minutes are its stalest.

The warm-up pays that cost before the traffic does: it runs the main job (``ngsi-assets materialize``,
every asset that needs no database) through the server ``runs`` times, each on a fresh throwaway lake
over the same generated sample of the demo city (NGSI v2 in its four formats, NGSI-LD, data-hub
messages), then deletes everything it made. It writes to no database and reads nothing of the
platform's: the variables that name a lake, a landing zone, a Dagster home or a database (``*_ROOT``,
``*_URL``, ``*_CONFIG``) or turn on a sink (``NGSI_MONGO_RAW_ENABLED``) are left out of its runs'
environment. The entity schema
(``NGSI_ENTITY_SCHEMA``, else the demo's) and the Spark, STH and run settings are kept, so the runs
use the query shapes the platform's own runs will.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_RUNS = 3
# A run on a new server takes about a minute on 2 cores; one that goes on much longer is stuck (a port
# where something other than a Spark Connect server listens never answers the client).
DEFAULT_RUN_TIMEOUT_S = 600.0
DEFAULT_NOTIFICATIONS = 500
MIN_NOTIFICATIONS = 500  # the demo city's smallest sample with every stream in it
DEMO_SCHEMA = Path(__file__).parent / "demo" / "entities.yaml"
# Where a run's environment names the platform's own state or a database, or turns on a sink that
# needs one: never given to the warm-up.
_EXTERNAL_SUFFIXES = ("_ROOT", "_URL", "_CONFIG")
_SINK_SWITCHES = ("NGSI_MONGO_RAW_ENABLED",)


class WarmUpError(RuntimeError):
    """A warm-up run that failed (its output's tail in the message)."""


@dataclass(frozen=True)
class WarmUpRun:
    seconds: float


def warm_up_env(remote: str, work: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a warm-up run through the server at ``remote``: ``base`` (default this
    process's) without the variables that name the platform's state or a database, with a lake,
    landing zone and Dagster home under ``work``."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not (k.startswith("NGSI_") and k.endswith(_EXTERNAL_SUFFIXES)) and k not in (*_SINK_SWITCHES, "DAGSTER_HOME")
    }
    env.update(
        {
            "NGSI_SPARK_REMOTE": remote,
            "NGSI_LANDING_ROOT": str(work / "landing"),
            "NGSI_LAKE_ROOT": str(work / "lake"),
            "DAGSTER_HOME": str(work / "home"),
        }
    )
    env.setdefault("NGSI_ENTITY_SCHEMA", str(DEMO_SCHEMA))
    env.pop("NGSI_SPARK_MASTER", None)
    return env


def server_address(remote: str) -> tuple[str, int]:
    """The host and port of a Spark Connect URL ``sc://host:port`` (optionally ``/;param=value``)."""
    parsed = urlsplit(remote)
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme != "sc" or not parsed.hostname or port is None:
        raise ValueError(f"a Spark Connect server is named sc://host:port, not {remote!r}")
    return parsed.hostname, port


def land_sample(landing: Path, notifications: int, seed: int = 7) -> None:
    """Land ``notifications`` generated requests of the demo city under ``landing`` through the
    receiver's validation."""
    from ngsi_assets.demo.city import generate_city, write_jsonl
    from ngsi_assets.ingest.landing import LandingWriter
    from ngsi_assets.ingest.loader import load_paths
    from ngsi_assets.ngsi.envelope import MessageIdFactory
    from ngsi_assets.ngsi.payloads import IngestSettings

    requests, _ = generate_city(seed=seed, hours=1, target_notifications=notifications)
    landing.mkdir(parents=True, exist_ok=True)
    sample = landing.parent / "sample.jsonl"
    write_jsonl(requests, sample)
    with LandingWriter(landing) as writer:
        load_paths([sample], writer, IngestSettings(guid_from_correlator=True), MessageIdFactory())
    sample.unlink()


def warm_up(
    remote: str,
    runs: int = DEFAULT_RUNS,
    notifications: int = DEFAULT_NOTIFICATIONS,
    *,
    base_env: Mapping[str, str] | None = None,
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    log: bool = False,
) -> list[WarmUpRun]:
    """Run the main job ``runs`` times through the Spark Connect server at ``remote`` over a
    generated sample (see the module docstring); each run's seconds. Raises ``WarmUpError`` when a
    run fails or takes longer than ``run_timeout_s``. Everything it made is deleted."""
    host, port = server_address(remote)
    if runs < 1:
        raise ValueError(f"warm-up runs must be at least 1, not {runs}")
    if notifications < MIN_NOTIFICATIONS:
        raise ValueError(
            f"warm-up notifications must be at least {MIN_NOTIFICATIONS} (every stream of the sample), "
            f"not {notifications}"
        )
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise WarmUpError(f"no Spark Connect server answers at {remote}: {exc}") from exc
    work = Path(tempfile.mkdtemp(prefix="ngsi-warm-up-"))
    try:
        land_sample(work / "landing", notifications)
        env = warm_up_env(remote, work, base_env)
        out = []
        for i in range(runs):
            for folder in ("lake", "home"):
                shutil.rmtree(work / folder, ignore_errors=True)
            (work / "home").mkdir()
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    [str(Path(sys.executable).with_name("ngsi-assets")), "materialize"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=run_timeout_s,
                )
            except subprocess.TimeoutExpired as exc:
                raise WarmUpError(
                    f"warm-up run {i + 1} of {runs} through {remote} did not finish within {run_timeout_s:g} s: "
                    "is that port a Spark Connect server's?"
                ) from exc
            if proc.returncode != 0:
                tail = (proc.stdout[-2000:] + proc.stderr[-4000:]).strip()
                raise WarmUpError(f"warm-up run {i + 1} of {runs} through {remote} failed ({proc.returncode}):\n{tail}")
            out.append(WarmUpRun(time.monotonic() - started))
            if log:
                print(f"warm-up run {i + 1}/{runs}: {out[-1].seconds:.1f} s", flush=True)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remote", default=None, help="the server, sc://host:port (default NGSI_SPARK_REMOTE)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"main-job runs (default {DEFAULT_RUNS})")
    parser.add_argument(
        "--notifications",
        type=int,
        default=DEFAULT_NOTIFICATIONS,
        help=f"generated notifications each run processes (default {DEFAULT_NOTIFICATIONS})",
    )


def run(args: argparse.Namespace) -> int:
    remote = args.remote or os.environ.get("NGSI_SPARK_REMOTE")
    if not remote:
        print("ngsi-assets spark warm-up: name the server with --remote sc://host:port or NGSI_SPARK_REMOTE",
              file=sys.stderr)  # fmt: skip
        return 2
    # Stopped (make dev's Ctrl-C stops its process group): end through the clean-up, which deletes
    # the sample and the throwaway lake and stops the run in flight.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        done = warm_up(remote, args.runs, args.notifications, log=True)
    except (ValueError, WarmUpError) as exc:
        print(f"ngsi-assets spark warm-up: {exc}", file=sys.stderr)
        return 1
    print(f"warmed {remote}: {len(done)} runs, {', '.join(f'{r.seconds:.1f}' for r in done)} s", flush=True)
    return 0
