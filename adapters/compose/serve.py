"""A service composed from the options of `nereus serve`: which mode, on which address.

Theory of operation: `serve` is what `nereus serve` (`adapters.cli.serve`) calls with its
parsed options. It makes the stop event first (a supervisor's end asks for the stop from
then on, as SIGTERM does later), reads the configuration (`adapters.compose.config`), checks
the listen address (without a configuration: loopback only, since nobody authenticates),
and hands over to one mode: the embedded one (`adapters.compose.embedded`), Kafka mode
(`adapters.compose.kafka`), or a supervisor of Kafka-mode processes
(`adapters.compose.processes`). Every refusal is one `refused` log line and exit 2, before
anything is opened that the refusal would have to close.
"""

from __future__ import annotations

import argparse
import ipaddress
import threading

from nereus.adapters.compose.config import load_configuration
from nereus.adapters.compose.embedded import serve_embedded
from nereus.adapters.compose.kafka import serve_kafka
from nereus.adapters.compose.lifeline import EXIT_MARGIN_S, follow_supervisor
from nereus.adapters.compose.processes import supervise
from nereus.adapters.compose.serve_clock import serve_clock
from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.runtime import compiled
from nereus.runtime.log import Logger, configure_json_logging


def serve(args: argparse.Namespace) -> int:
    """Run the service `args` (the options of `nereus serve`) describe, until stopped; the
    process's exit code."""
    configure_json_logging(level=args.log_level)
    log = Logger()
    # Made first: from here on a supervisor's end asks for the stop, as SIGTERM does later.
    stop = threading.Event()
    if args.supervisor_fd is not None:
        exit_after_s = args.stop_timeout_s + EXIT_MARGIN_S
        if not follow_supervisor(args.supervisor_fd, stop.set, exit_after_s, log):
            return 2
    tenancy = _tenancy(args, log)
    if tenancy is None:
        return 2
    log.info("kernel", compiled_modules=compiled.compiled_modules())
    address = _listen_address(args, tenancy, log)
    if address is None or not _mode_allowed(args, tenancy, log):
        return 2
    if not args.kafka:
        return serve_embedded(args, log, tenancy, address, stop=stop)
    if args.processes > 1:
        # Each process checks its clock too; the supervisor refuses once, before any.
        if serve_clock(args, log) is None:
            return 2
        return supervise(args, args.argv, log, address, tenancy.server.backlog)
    return serve_kafka(args, log, tenancy, address, stop=stop)


def _mode_allowed(args: argparse.Namespace, tenancy: Tenancy, log: Logger) -> bool:
    """Whether the options name one mode the build runs (refusals logged)."""
    if args.processes != 1 and not args.kafka:
        log.error("refused", detail="--processes needs Kafka mode (--kafka): it shares shards")
        return False
    if not args.kafka:
        return True
    if args.pulsar or tenancy.pulsar:
        log.error("refused", detail="the Pulsar destination runs in the embedded mode only")
        return False
    if args.processes < 1:
        log.error("refused", detail=f"--processes must be at least 1, not {args.processes}")
        return False
    return True


def _tenancy(args: argparse.Namespace, log: Logger) -> Tenancy | None:
    if args.config is None:
        return Tenancy.open_default()
    try:
        return load_configuration(args.config)
    except ConfigError as exc:
        log.error("refused", detail=str(exc), config=exc.source, key=exc.key)
        return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen_address(
    args: argparse.Namespace, tenancy: Tenancy, log: Logger
) -> tuple[str, int] | None:
    if args.http is None:
        host, port = tenancy.server.host, tenancy.server.port
    else:
        host, _, port_text = args.http.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            port = int(port_text)
        except ValueError:
            log.error("refused", detail=f"--http wants HOST:PORT, not {args.http!r}")
            return None
    if tenancy.auth_disabled and not _is_loopback(host):
        log.error(
            "refused",
            detail=f"without --config the service has no authentication and binds loopback "
            f"only; {host!r} is not a loopback address (give a --config with tenants and "
            "tokens to listen elsewhere)",
            http=f"{host}:{port}",
        )
        return None
    return host, port
