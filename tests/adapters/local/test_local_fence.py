"""The local destination's own lock, and the proofs of absence it makes possible.

The rules, from `specs/library.md` ("One owner per directory") and `specs/README.md`: a
destination directory has one writer at a time (a second is refused naming the holder);
readers take no lock and work beside the writer; the writer's fence id is the directory's,
the same for every writer of it; and a search proves an attempt absent only while its
instance holds the lock, only for an attempt admitted before that instance took the lock
(anything later may be its own, still to be sent), and never while a send of its own is half
done. A routed set proves an attempt absent only by its own target's fence.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.routed import RoutedDestination
from nereus.runtime.destination import (
    FinishedSearch,
    Lookup,
    PreparedPublish,
    Search,
    SearchOutcome,
    Send,
    fence_id_for,
)
from nereus.storage.lock import StoreLocked

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 30.0


def _send(topic: str, n: int) -> Send:
    prepared = PreparedPublish(
        "local", topic, None, f"v{n}".encode(), (), f"m{n}", 1, f"t{n}", 0, None, False
    )
    return Send(f"m{n}.1.{uuid.uuid4().hex[:6]}", prepared)


def _outcome(dest: LocalDestination | RoutedDestination, lookups: list[Lookup]) -> SearchOutcome:
    handle = dest.search(lookups, lambda: None)
    assert handle.done()
    return handle.outcome()


def _wall_ms() -> int:
    return int(time.time() * 1000)


# One writer ---------------------------------------------------------------------------------


_TRY_WRITER = (
    "import sys\n"
    "from nereus.adapters.local.destination import LocalDestination\n"
    "from nereus.runtime.destination import PreparedPublish, Send\n"
    "from nereus.storage.lock import StoreLocked\n"
    "d = LocalDestination(sys.argv[1])\n"
    "p = PreparedPublish('local', 'q', None, b'v', (), 'm', 1, 't', 0, None, False)\n"
    "try:\n"
    "    if sys.argv[2] == 'open':\n"
    "        d.open('other')\n"
    "    d.submit([Send('m.1.x', p)], 1000)\n"
    "except StoreLocked as e:\n"
    "    print(e.holder_pid); print(e); sys.exit(3)\n"
    "print(d.fence_id)\n"
    "d.close()\n"
)

_READER = (
    "import sys\n"
    "from nereus.adapters.local.consumer import LocalConsumer\n"
    "from nereus.adapters.local.destination import LocalDestination\n"
    "d = LocalDestination(sys.argv[1])\n"
    "aid = sys.argv[2]\n"
    "with LocalConsumer(d, 'q', group='g') as c:\n"
    "    got = [r.offset for r in c.records(limit=5, idle_timeout_s=10)]\n"
    "print(d.end_offset('q'), got, d.committed('g', 'q'), d.find(aid, 'q', 0) is not None)\n"
    "d.close()\n"
)


def sends(count: int) -> list[Send]:
    return [_send("q", n) for n in range(count)]


def _other_process(program: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=ROOT,
        capture_output=True,
        timeout=WAIT_S,
        check=False,
    )


@pytest.mark.parametrize("how", ["open", "submit"])
def test_a_second_writer_of_a_destination_directory_is_refused_naming_the_holder(
    tmp_path: Path, how: str
) -> None:
    """A runtime's destination (`open`) or a program that only submits: either is refused
    while another process writes the directory, and told which process that is."""
    path = str(tmp_path / "destination")
    first = LocalDestination(path)
    first.open("store-1")
    before = first.end_offset("q")
    done = _other_process(_TRY_WRITER, path, how)
    assert done.returncode == 3, (done.stdout, done.stderr.decode())
    pid_line, message = done.stdout.decode().splitlines()[:2]
    assert int(pid_line) == os.getpid()
    assert f"in use by process {os.getpid()}" in message
    assert first.end_offset("q") == before  # it wrote nothing

    # Once the writer closes, the next one writes, under the same directory's fence id.
    fence_id = first.fence_id
    first.close()
    done = _other_process(_TRY_WRITER, path, how)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == fence_id


def test_readers_work_beside_the_writer(tmp_path: Path) -> None:
    """A consumer in another process reads, commits its group's position and finds an
    attempt by id while the writer holds the directory and goes on writing."""
    path = str(tmp_path / "destination")
    writer = LocalDestination(path)
    writer.open("store")
    written = sends(5)
    writer.submit(written, 1_000)
    assert len(writer.poll(0)) == 5
    done = _other_process(_READER, path, written[2].attempt_id)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split(maxsplit=1) == ["5", "[0, 1, 2, 3, 4] 5 True\n"]
    assert writer.committed("g", "q") == 5
    writer.submit([_send("q", 5)], 1_000)  # the writer is undisturbed
    assert writer.end_offset("q") == 6
    writer.close()


# The fence ----------------------------------------------------------------------------------


def test_the_fence_id_is_the_directorys_for_every_writer_of_it(tmp_path: Path) -> None:
    path = str(tmp_path / "destination")
    first = LocalDestination(path)
    first.open("store")
    fence_id = first.fence_id
    assert fence_id is not None and fence_id.startswith("local:")
    first.close()
    later = LocalDestination(path)
    later.open("another store")  # the id is the directory's, not the store's
    assert later.fence_id == fence_id
    later.close()
    elsewhere = LocalDestination(str(tmp_path / "another"))
    elsewhere.open("store")
    assert elsewhere.fence_id not in (None, fence_id)
    elsewhere.close()


def test_a_search_without_the_lock_proves_nothing(tmp_path: Path) -> None:
    """An instance that never became the writer (a reader) searches without a fence."""
    path = str(tmp_path / "destination")
    writer = LocalDestination(path)
    writer.open("store")
    fence_id = writer.fence_id
    writer.close()
    reader = LocalDestination(path)
    outcome = _outcome(reader, [Lookup("never-sent", "q", 0)])
    assert outcome.complete and outcome.fence is None
    assert outcome.proof_for(fence_id, "never-sent") is None
    reader.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    admitted=st.lists(st.tuples(st.integers(-5_000, 5_000), st.booleans()), min_size=1, max_size=12)
)
def test_a_search_proves_absent_only_what_was_admitted_before_the_lock_and_not_found(
    tmp_path_factory: pytest.TempPathFactory, admitted: list[tuple[int, bool]]
) -> None:
    """Each attempt: its admission's time relative to when the writer took the lock, and
    whether its record was written. Absent is proven exactly for the unwritten attempts
    admitted before the lock; the written ones are found; nothing else is proven."""
    dest = LocalDestination(str(tmp_path_factory.mktemp("fence") / "destination"))
    dest.open("store")
    try:
        fence = dest.fence
        assert fence is not None
        lookups: list[Lookup] = []
        for n, (offset_ms, written) in enumerate(admitted):
            send = _send("q", n)
            if written:
                dest.submit([send], 1_000)
            lookups.append(Lookup(send.attempt_id, "q", fence.fenced_at_ms + offset_ms))
        outcome = _outcome(dest, lookups)
        assert outcome.complete
        for lookup, (offset_ms, written) in zip(lookups, admitted, strict=True):
            aid = lookup.attempt_id
            assert (aid in outcome.found) == written
            proof = outcome.proof_for(dest.fence_id, aid) if aid not in outcome.found else None
            assert (proof is not None) == (not written and offset_ms < 0), (offset_ms, written)
            if proof is not None:
                assert proof.fence_id == dest.fence_id
            assert outcome.proof_for("local:another-directory", aid) is None
    finally:
        dest.close()


def test_an_attempt_admitted_after_the_lock_is_never_proven_absent(tmp_path: Path) -> None:
    """The writer's own attempt, not sent yet (or whose send failed before the write):
    however complete the search, it proves nothing, now or later."""
    dest = LocalDestination(str(tmp_path / "destination"))
    dest.open("store")
    fence = dest.fence
    assert fence is not None
    mine = Lookup("mine", "q", max(_wall_ms(), fence.fenced_at_ms))
    earlier = Lookup("earlier", "q", fence.fenced_at_ms - 1)
    outcome = _outcome(dest, [mine, earlier])
    assert outcome.complete and outcome.fence == fence
    assert outcome.proof_for(dest.fence_id, "mine") is None
    assert outcome.proof_for(dest.fence_id, "earlier") is not None
    dest.close()


def test_a_search_waits_for_a_send_in_progress_and_finds_its_record(tmp_path: Path) -> None:
    """A send held inside `submit` (before its write) on one thread; a search for it on
    another, even for an attempt that the clock says was admitted before the lock, neither
    misses it nor proves it absent: it waits for the send and finds the record."""
    entered = threading.Event()
    release = threading.Event()

    def hold(sends: Sequence[Send]) -> None:
        entered.set()
        assert release.wait(WAIT_S)

    dest = LocalDestination(str(tmp_path / "destination"), before_send=hold)
    dest.open("store")
    fence = dest.fence
    assert fence is not None
    send = _send("q", 0)
    sender = threading.Thread(target=dest.submit, args=([send], 1_000))
    sender.start()
    assert entered.wait(WAIT_S)
    result: list[SearchOutcome] = []
    searcher = threading.Thread(
        target=lambda: result.append(
            _outcome(dest, [Lookup(send.attempt_id, "q", fence.fenced_at_ms - 1_000)])
        )
    )
    searcher.start()
    searcher.join(0.3)
    assert searcher.is_alive(), "the search read the index while a send was half done"
    release.set()
    sender.join(WAIT_S)
    searcher.join(WAIT_S)
    (outcome,) = result
    assert send.attempt_id in outcome.found  # found: nothing to prove absent
    dest.close()


# A routed set -------------------------------------------------------------------------------


class _Unfenced(LocalDestination):
    """A target that cannot be fenced (as a Pulsar one): its searches prove nothing."""

    def open(self, store_id: str) -> None:
        super().open(store_id)
        self.fence_id = None

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        outcome = super().search(lookups, wake).outcome()
        return FinishedSearch(msgspec.structs.replace(outcome, fence=None))


def test_a_routed_set_proves_absence_per_target_under_its_own_fence(tmp_path: Path) -> None:
    local = LocalDestination(str(tmp_path / "local"))
    other = _Unfenced(str(tmp_path / "other"))
    routed = RoutedDestination({"local": local, "other": other}, {"b": "other"}, "local")
    routed.open("store")
    local_topic = routed.topic_for("a", tenant="default")
    other_topic = routed.topic_for("b", tenant="default")
    assert fence_id_for(routed, local_topic) == local.fence_id is not None
    assert fence_id_for(routed, other_topic) is None
    assert routed.fence_id is None
    fence = local.fence
    assert fence is not None
    before = fence.fenced_at_ms - 1
    lookups = [Lookup("to-local", local_topic, before), Lookup("to-other", other_topic, before)]
    outcome = _outcome(routed, lookups)
    proof = outcome.proof_for(local.fence_id, "to-local")
    assert proof is not None and proof.fence_id == local.fence_id
    assert outcome.proof_for(None, "to-other") is None
    # The local fence says nothing about the other target's attempts, nor about attempts
    # no target looked for.
    assert outcome.proof_for(local.fence_id, "to-other") is None
    assert outcome.proof_for(local.fence_id, "never-looked-for") is None
    routed.close()


def test_the_lock_goes_with_a_killed_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "destination")
    program = (
        "import sys, time\n"
        "from nereus.adapters.local.destination import LocalDestination\n"
        "d = LocalDestination(sys.argv[1])\n"
        "d.open('s')\n"
        "print(d.fence_id, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", program, path], cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        fence_id = child.stdout.readline().decode().strip()
        refused = LocalDestination(path)
        with pytest.raises(StoreLocked) as err:
            refused.open("s")
        assert err.value.holder_pid == child.pid
        refused.close()
    finally:
        child.kill()
        child.wait(WAIT_S)
    after = LocalDestination(path)
    after.open("s")
    assert after.fence_id == fence_id
    after.close()
