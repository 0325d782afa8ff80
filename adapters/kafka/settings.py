"""librdkafka's own judgement of the client settings of a config file's `[kafka]` section,
and a first contact with the cluster that says why it failed.

Theory of operation: librdkafka knows its settings (several hundred, with their types,
ranges and the features this build has), so Nereus does not keep a copy of the list:
`refusal` builds one producer with the settings and no brokers, which connects nowhere, and
reports what librdkafka refused (an unknown or misspelled name, a value of the wrong kind, a
SASL mechanism or a TLS file this build cannot use). Consumer-only settings are accepted by
a producer with a warning, so one check covers every client. A refused login is not a
setting librdkafka can judge alone, and its clients only retry it while their callers time
out; `unreachable` asks the cluster for its metadata once with the same settings and
reports the first error the client met (an authentication failure at once).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

# Errors after which asking again cannot help.
_FATAL = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._INVALID_ARG})


def refusal(settings: Mapping[str, str | int | float | bool]) -> str | None:
    """librdkafka's complaint about `settings`, or None if it takes them."""
    if not settings:
        return None
    try:
        # log_level 0: a client without brokers would warn that it cannot connect.
        producer = Producer({**settings, "log_level": 0})
    except KafkaException as exc:
        return str(exc.args[0].str())
    except (TypeError, ValueError) as exc:
        return str(exc)
    del producer
    return None


def unreachable(
    bootstrap: str, settings: Mapping[str, str | int | float | bool], timeout_s: float
) -> str | None:
    """Why the cluster at `bootstrap` does not answer with these settings, or None."""
    errors: list[Any] = []
    conf: dict[str, Any] = {**settings, "bootstrap.servers": bootstrap, "log_level": 0}
    conf["error_cb"] = errors.append
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(1.0, max(deadline - time.monotonic(), 0.1)))
            return None
        except KafkaException as exc:
            last = exc.args[0]
        admin.poll(0)  # serves error_cb
        fatal = [e for e in errors if e.code() in _FATAL]
        if fatal:
            return f"{bootstrap}: {fatal[0].str()}"
        if time.monotonic() >= deadline:
            seen = errors[-1] if errors else last
            return f"{bootstrap}: no answer within {timeout_s:g} s ({seen.str()})"
