"""The console in Kafka mode, against the real broker: `nereus serve --kafka --processes 2`
answers every console page for the whole machine, whichever process accepts the connection
(as /metrics does): the overview lists every shard, its fire-lag windows count the
publications of every process, a timer's story is found on any shard, with the Kafka
evidence of its publication (topic, partition, offset), and the audit page lists every
shard: an audit of a shard the answering process does not own runs beside the process that
owns it, and its equal digests are shown whichever process answers."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

from tests.adapters.kafka.test_kafka_processes import (
    PROCESSES,
    SHARDS,
    _all_active,
    _serving,
    _supervisor,
)
from tests.support import kafka_env
from tests.support.console_client import Page, Visitor
from tests.support.kafka_cluster import ServiceProc, Topics, schedule_many, wait_until
from tests.support.kafka_env import destination_topic

kafka_bootstrap = kafka_env.kafka_bootstrap

ASKS = 12  # fresh connections per page: each is taken by whichever process accepts it


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        assert "script-src" not in resp.headers["Content-Security-Policy"]
        return str(resp.read().decode())


def _shards_listed(text: str) -> set[int]:
    table = text[text.index('id="shards"') : text.index("</table>", text.index('id="shards"'))]
    return {int(n) for n in re.findall(r"<tr class=\"state-[^\"]+\">\s*<td>(\d+)</td>", table)}


def _lag(text: str) -> tuple[str, int]:
    """The fire-lag chart's scope and the publications counted in its windows."""
    scope = re.search(r'<span id="lag-scope">(.*?)</span>', text)
    published = re.search(r'<span id="lag-published">(\d+)</span>', text)
    assert scope is not None and published is not None
    return scope.group(1), int(published.group(1))


def _delivered_by_owner(text: str) -> dict[str, int]:
    """Each shard owner's deliveries, from the overview's shard table."""
    table = text[text.index('id="shards"') : text.index("</table>", text.index('id="shards"'))]
    found: dict[str, int] = {}
    for row in re.findall(r"<tr class=\"state-[^\"]+\">(.*?)</tr>", table, re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        found[cells[2]] = found.get(cells[2], 0) + int(cells[11])
    return found


def test_every_process_answers_the_console_for_the_whole_machine(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    destination = destination_topic(kafka_bootstrap)
    topics = Topics.unique(destination)
    sup = _supervisor(kafka_bootstrap, topics, tmp_path)
    keys = [f"c{i}" for i in range(16)]
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving(sup)) == PROCESSES, 60, "both processes serving")
        wait_until(lambda: _all_active(sup), 90, "the shards spread over both processes")
        # The first overview starts the lag sampler of the process that answers it and, by
        # asking them, its siblings': publications before that are in no window.
        wait_until(
            lambda: _lag(_page(f"{sup.url}/console/overview"))[0] == f"all {PROCESSES} processes",
            30,
            "the lag chart covering both processes",
        )
        schedule_many(sup, keys, delay_ms=0)

        def published() -> bool:
            text = _page(f"{sup.url}/console/timer?queue={topics.queue}&key={keys[-1]}")
            return "verdict-PUBLISHED" in text

        wait_until(published, 60, "the last timer published")
        wait_until(
            lambda: _lag(_page(f"{sup.url}/console/overview"))[1] == len(keys),
            30,
            "every publication in the lag windows",
        )
        overviews = [_page(f"{sup.url}/console/overview") for _ in range(ASKS)]
        stories = [_page(f"{sup.url}/console/timer?queue={topics.queue}&key={k}") for k in keys]
        queues = [_page(f"{sup.url}/console/queues") for _ in range(ASKS)]
        asker, shard, owner_pids = _audit_a_shard_owned_elsewhere(sup)
        audits = [_audit_row(Visitor(_port(sup)).get("/console/audit"), shard) for _ in range(ASKS)]
        assert sup.stop() == 0
    finally:
        sup.kill()
    for text in overviews:
        assert _shards_listed(text) == set(range(SHARDS))
        # The timers fired on shards of both processes, and whichever process answered,
        # its chart counts them all.
        delivered = _delivered_by_owner(text)
        assert len(delivered) == PROCESSES and all(delivered.values()), delivered
        assert sum(delivered.values()) == len(keys)
        assert _lag(text) == (f"all {PROCESSES} processes", len(keys))
    for key, text in zip(keys, stories, strict=True):
        assert 'id="status"' in text and ">DELIVERED<" in text, key
        assert "SCHEDULE_V1" in text and "verdict-PUBLISHED" in text, key
        assert f'<span class="v">{destination}</span>' in text, key
        assert re.search(r'<span class="k">offset</span> <span class="v">\d+</span>', text)
    for row in audits:  # the one audit, shown whichever process answered
        assert 'class="audit-ok"' in row, row
        digests = re.findall(r"<td><code>([0-9a-f]{16,})</code></td>", row)
        assert len(digests) == 2 and digests[0] == digests[1], row
        parent = int(re.findall(r'class="audit-parent">(\d+)<', row)[0])
        assert parent != asker and parent in owner_pids, (asker, parent, owner_pids)
    for text in queues:  # publications of every shard, whichever process answered
        listed = set(re.findall(r"key=(c\d+)", text))
        assert len(listed) > len(keys) // 2, listed


def _port(sup: ServiceProc) -> int:
    return int(urllib.parse.urlsplit(sup.url).port or 0)


def _audit_row(page: Page, shard: int) -> str:
    found = re.search(rf'<tr class="audit-[a-z]+" id="audit-{shard}">.*?</tr>', page.text, re.S)
    assert found is not None, page.text
    return found.group(0)


def _audit_a_shard_owned_elsewhere(sup: ServiceProc) -> tuple[int, int, set[int]]:
    """Over one connection (so one process answers every request on it): ask that process
    which shards it owns, then for the audit of one it does not own; wait until it is done.
    The asking process's pid, the shard, and the pids of the service's processes."""
    port = _port(sup)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/healthz")
        health = json.loads(conn.getresponse().read())
        asker = int(health["process"].split(":")[1])
        owned = {int(p) for p, state in health["owned"].items() if state == "active"}
        shard = min(set(range(SHARDS)) - owned)
        conn.request("GET", "/console/audit")
        resp = conn.getresponse()
        cookie = (resp.getheader("Set-Cookie") or "").split(";", 1)[0]
        text = resp.read().decode()
        listed = {int(n) for n in re.findall(r"<option>(\d+)</option>", text)}
        assert listed == set(range(SHARDS)), text
        assert f'id="answered-by">{asker}<' in text
        csrf = re.findall(r'name="csrf" value="([0-9a-f]+)"', text)[0]
        form = urllib.parse.urlencode({"shard": str(shard), "csrf": csrf})
        headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", "/console/audit", body=form, headers=headers)
        started = conn.getresponse()
        assert started.status == 303, started.read()
        started.read()
    finally:
        conn.close()
    visitor = Visitor(port)
    wait_until(
        lambda: "audit-running" not in _audit_row(visitor.get("/console/audit"), shard),
        60,
        "the audit of a shard another process owns",
    )
    return asker, shard, set(_serving(sup).values())
