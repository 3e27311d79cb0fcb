"""The ``ngsi-assets`` command line.

Subcommands live in :data:`COMMANDS` (name -> :class:`Command`); adding one is adding an entry.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from ngsi_assets import settings
from ngsi_assets.ngsi.constants import DEFAULT_SERVICE, DEFAULT_SERVICE_PATH
from ngsi_assets.ngsi.payloads import Endpoint, IngestSettings

DEFAULT_PORT = 5050
DEFAULT_MAX_BODY_BYTES = 1_048_576


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, how it declares its arguments, and what it runs."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _add_landing_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--landing-root",
        type=Path,
        default=None,
        help="landing zone folder (default: $NGSI_LANDING_ROOT, else $NGSI_DATA_ROOT/landing, else .data/landing)",
    )


def _add_ingest_settings(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("validation")
    group.add_argument("--default-service", default=DEFAULT_SERVICE, help="service when Fiware-Service is absent")
    group.add_argument(
        "--default-service-path",
        default=DEFAULT_SERVICE_PATH,
        help="service path when Fiware-ServicePath is absent",
    )
    group.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest body accepted")
    group.add_argument(
        "--guid-from-correlator",
        action="store_true",
        help="without X-Message-Guid, use '<Fiware-Correlator>;cbnotif=<N>' as the message guid (dedup key)",
    )


def _add_writer_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("landing writer")
    group.add_argument("--max-segment-bytes", type=int, default=None, help="roll segments at this size")
    group.add_argument("--max-batch", type=int, default=None, help="most lines per group commit")
    group.add_argument(
        "--max-delay-ms", type=float, default=None, help="wait this long for a group commit to fill (default 0)"
    )


def _settings(args: argparse.Namespace) -> IngestSettings:
    return IngestSettings(
        default_service=args.default_service,
        default_service_path=args.default_service_path,
        max_body_bytes=args.max_body_bytes,
        guid_from_correlator=args.guid_from_correlator,
    )


def _landing_root(args: argparse.Namespace) -> Path:
    return args.landing_root if args.landing_root is not None else Path(settings.landing_root())


# ---- serve -----------------------------------------------------------------------------------


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="receiver processes sharing the port via SO_REUSEPORT, each with its own writer (default 1)",
    )
    _add_landing_root(parser)
    _add_ingest_settings(parser)
    _add_writer_options(parser)


def _run_serve(args: argparse.Namespace) -> int:
    from ngsi_assets.ingest.receiver import WriterOptions, serve

    serve(
        args.host,
        args.port,
        _landing_root(args),
        _settings(args),
        workers=args.workers,
        writer_options=WriterOptions(
            max_segment_bytes=args.max_segment_bytes, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms
        ),
    )
    return 0


# ---- load ------------------------------------------------------------------------------------


def _configure_load(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help=".jsonl/.ndjson request files, .json bodies, folders")
    _add_landing_root(parser)
    parser.add_argument(
        "--endpoint",
        choices=[e.value for e in Endpoint],
        default=Endpoint.NOTIFY.value,
        help="endpoint for .json bodies and for lines without one (default notify)",
    )
    parser.add_argument("--service", default=None, help="Fiware-Service header")
    parser.add_argument("--service-path", default=None, help="Fiware-ServicePath header")
    parser.add_argument("--attrs-format", default=None, help="Ngsiv2-AttrsFormat header")
    parser.add_argument("--content-type", default="application/json", help="Content-Type header")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_ingest_settings(parser)
    _add_writer_options(parser)


def _run_load(args: argparse.Namespace) -> int:
    from ngsi_assets.ingest.loader import default_headers, format_report, load_paths
    from ngsi_assets.ingest.receiver import WriterOptions
    from ngsi_assets.ngsi.envelope import MessageIdFactory

    options = WriterOptions(
        max_segment_bytes=args.max_segment_bytes, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms
    )
    with options.open(_landing_root(args)) as writer:
        report = load_paths(
            args.paths,
            writer,
            _settings(args),
            MessageIdFactory(),
            endpoint=Endpoint(args.endpoint),
            headers=default_headers(
                service=args.service,
                service_path=args.service_path,
                attrs_format=args.attrs_format,
                content_type=args.content_type,
            ),
        )
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        for line in format_report(report):
            print(line)
    if report.write_error:
        return 2
    return 0 if report.ok else 1


def _configure_history(parser: argparse.ArgumentParser) -> None:
    from ngsi_assets import history_cli

    history_cli.configure(parser)


def _run_history(args: argparse.Namespace) -> int:
    from ngsi_assets import history_cli

    return history_cli.run(args)


def _configure_materialize(parser: argparse.ArgumentParser) -> None:
    from ngsi_assets import materialize

    materialize.configure(parser)


def _run_materialize(args: argparse.Namespace) -> int:
    from ngsi_assets import materialize

    return materialize.run(args)


def _configure_spark(parser: argparse.ArgumentParser) -> None:
    from ngsi_assets import spark_warmup
    from ngsi_assets.spark_servers import DEFAULT_CONNECT_PORT

    servers = parser.add_subparsers(dest="server", required=True, metavar="SERVER")
    connect = servers.add_parser("connect-server", help="a Spark Connect server in the foreground")
    connect.add_argument("--host", default="127.0.0.1")
    connect.add_argument("--port", type=int, default=DEFAULT_CONNECT_PORT)
    connect.add_argument("--master", default="local[*]", help="where the server runs the work (default local[*])")
    connect.add_argument("--driver-memory", default=None, help="default NGSI_SPARK_DRIVER_MEMORY, else 4g")
    master = servers.add_parser("master", help="a standalone cluster's master in the foreground")
    master.add_argument("--host", default="127.0.0.1")
    master.add_argument("--port", type=int, default=7077)
    master.add_argument("--webui-port", type=int, default=8080)
    worker = servers.add_parser("worker", help="a standalone worker in the foreground")
    worker.add_argument("master_url", help="spark://host:port")
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--cores", type=int, default=1)
    worker.add_argument("--memory", default="2g")
    worker.add_argument("--webui-port", type=int, default=8081)
    warm = servers.add_parser(
        "warm-up",
        help="run the main job through a new Spark Connect server on a throwaway sample, so its first runs are fast",
        description=spark_warmup.__doc__.split("\n\n")[0] if spark_warmup.__doc__ else None,
    )
    spark_warmup.configure(warm)
    for p in (connect, master, worker):
        p.add_argument("--log-dir", type=Path, default=Path(".data/spark"), help="logs and pid files")


def _run_spark(args: argparse.Namespace) -> int:
    from ngsi_assets import spark_servers as s

    if args.server == "warm-up":
        from ngsi_assets import spark_warmup

        return spark_warmup.run(args)
    if args.server == "connect-server":
        cmd = s.connect_server_command(args.port, host=args.host, master=args.master, driver_memory=args.driver_memory)
    elif args.server == "master":
        taken = s.master_port_taken(args.host, args.port)
        if taken:
            print(
                f"ngsi-assets spark master: {taken}; Spark would move the master to another port, where the workers "
                f"and drivers told spark://{args.host}:{args.port} would not find it. Stop what listens there, or "
                "choose another --port.",
                file=sys.stderr,
            )
            return 2
        cmd = s.master_command(args.host, args.port, args.webui_port)
    else:
        cmd = s.worker_command(
            args.master_url, host=args.host, cores=args.cores, memory=args.memory, webui_port=args.webui_port
        )
    args.log_dir.mkdir(parents=True, exist_ok=True)
    os.execve(cmd[0], cmd, s.server_env(args.log_dir.resolve(), host=args.host))


def _configure_config(parser: argparse.ArgumentParser) -> None:
    from ngsi_assets import cygnus_import

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cygnus_import.configure(
        actions.add_parser(
            "import-cygnus",
            help="turn a Cygnus agent.conf into this platform's SQL sink file and environment",
            description=cygnus_import.__doc__.split("\n\n")[0] if cygnus_import.__doc__ else None,
        )
    )


def _run_config(args: argparse.Namespace) -> int:
    from ngsi_assets import cygnus_import

    return cygnus_import.run(args)


# ---- sth-api ---------------------------------------------------------------------------------


def _configure_sth_api(parser: argparse.ArgumentParser) -> None:
    from ngsi_assets.sth_api import DEFAULT_PORT as STH_PORT

    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument(
        "--port", type=int, default=STH_PORT, help=f"port (default {STH_PORT}, STH-Comet's; 0: any free)"
    )


def _run_sth_api(args: argparse.Namespace) -> int:
    from ngsi_assets.sth_api import ApiSettings, serve

    try:
        api_settings = ApiSettings.from_env()
    except ValueError as exc:
        print(f"ngsi-assets sth-api: {exc}", file=sys.stderr)
        return 2
    serve(args.host, args.port, api_settings)
    return 0


COMMANDS: dict[str, Command] = {
    "serve": Command("run the notification receiver", _configure_serve, _run_serve),
    "load": Command("land notifications from files through the receiver's validation", _configure_load, _run_load),
    "history": Command("inspect, tag and rewind the transaction history", _configure_history, _run_history),
    "materialize": Command(
        "run the main job (message store to every sink) for the landed hours", _configure_materialize, _run_materialize
    ),
    "spark": Command(
        "run a Spark Connect server or a standalone master or worker; warm a new server up",
        _configure_spark,
        _run_spark,
    ),
    "config": Command("import configuration from other tools (a Cygnus agent.conf)", _configure_config, _run_config),
    "sth-api": Command(
        "serve STH-Comet's read API (aggregated and raw history) from MongoDB ($NGSI_MONGO_URL)",
        _configure_sth_api,
        _run_sth_api,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ngsi-assets", description="FIWARE NGSI notifications as Dagster assets")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=command.help, description=command.help)
        command.configure(sub_parser)
        sub_parser.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    raise SystemExit(main())
