"""A seeded random shard workload, and the worker process the crash tests kill.

Theory of operation: the crash test needs a process that is always in the middle of durable
work when SIGKILL lands, and the storage tests need a workload that exercises every kind of
record against a real store. `Workload` draws each batch from one `random.Random`, building
records against the store's *applied* state the way the runtime would (admissions only for
due timeline work, outcomes only for open obligations), so a batch is realistic but may still
race with its own unapplied entries; those get rejected outcomes, which is what the log is for.
The clock it stamps with sometimes runs backwards: the store must clamp it.

Run as `python -m tests.support.crash_worker DIR SEED [--acks] [--no-sync] [--die-at STEP:N]
[--steps K]`: it opens (or creates) the store in DIR, prints `ready`, then appends and
applies batches forever (a safety deadline ends an orphaned worker). `--acks` prints a line
for every durable write once it has returned (what a client would have been told): `ack
APPLIED LOG_END POSITION:DIGEST ...`, the digest being that of each entry it appended.
`--no-sync` opens the store without fsync (the power-loss tests prove they notice);
`--die-at` SIGKILLs the worker itself at the N-th crash window named STEP (`ShardStore.
fault_hook`: append, fold, meta, sync), after printing `dying STEP`; `--steps` stops after K
steps and waits to be killed.

`check_reopened` is what the crash tests hold a store to after a kill.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence

from nereus import kernel as k
from nereus.kernel.digest import state_digest
from nereus.kernel.keys import attempt_prefix, timeline_key
from nereus.kernel.model import Message, Obligation, PayloadRef, Table, TimelineWork
from nereus.kernel.records import Appendable, LogEntry, encode_entry
from nereus.kernel.timing import MIN_TIME_MS
from nereus.replay.fold import replay
from nereus.storage.codec import decode_struct, lane_index_key
from nereus.storage.schema import PayloadBlob, StoreOptions
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, TENANT
from tests.support.story import rule_marks, story_problems

# Small horizons and a small budget so expiry, retries and dead letters happen quickly.
CONFIG = k.KernelConfig(
    limits=k.TimingLimits(
        min_delivery_window_ms=1_000,
        max_delay_horizon_ms=20_000,
        max_message_lifetime_ms=30_000,
    ),
    default_expiry_grace_ms=6_000,
    max_attempts=3,
    backoff_base_ms=100,
    backoff_max_ms=1_600,
)
PAYLOADS: tuple[bytes, ...] = (b"payload", b"other payload", b"a third, longer payload" * 8)
QUEUES = ("q1", "q2")
KEYS = tuple(f"k{i}" for i in range(8))
CLOCK_ERROR_MS = 5
WORKER_DEADLINE_S = 120.0


def digest_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


class Workload:
    """Seeded batches of records, built against what the store has applied."""

    def __init__(self, rng: random.Random, start_ms: int = T0_MS, seq: int = 0) -> None:
        self.rng = rng
        self.clock_ms = start_ms  # the "wall clock"; may run backwards
        # Numbers attempt and claim ids. A restarted worker starts past the log's end, so
        # its ids never collide with those of an earlier run (each id costs a position).
        self.seq = seq

    def tick(self) -> int:
        if self.rng.random() < 0.05:
            self.clock_ms -= self.rng.randint(1, 500)
        else:
            self.clock_ms += self.rng.choice((0, 1, 50, 100, 400, 1_000, 3_000))
        return self.clock_ms

    def _identity(self) -> tuple[str, str, str]:
        return TENANT, self.rng.choice(QUEUES), self.rng.choice(KEYS)

    def batch(self, store: ShardStore, now_ms: int) -> list[Appendable]:
        rng = self.rng
        earliest_ms = now_ms - CLOCK_ERROR_MS
        interval = k.TrustedInterval(earliest_ms, now_ms + CLOCK_ERROR_MS)
        items: list[Appendable] = []
        with store.read() as base:
            # Due discovery is a cursor scan of the timeline up to the earliest "now"; work
            # past its expireAt is due too (its actionAt is never later than expireAt).
            start = timeline_key(MIN_TIME_MS, "00" * 16, 0)
            stop = timeline_key(earliest_ms + 1, "00" * 16, 0)
            due = [
                work
                for _key, work in base.range(Table.TIMELINE, start, stop)
                if isinstance(work, TimelineWork)
            ]
            open_obligations = [
                (key.decode(), value)
                for key, value in base.items(Table.OBLIGATIONS)
                if isinstance(value, Obligation)
            ]
            for _ in range(rng.randint(1, 8)):
                roll = rng.random()
                if roll < 0.30:
                    items.append(self._schedule())
                elif roll < 0.40:
                    tenant, queue, key = self._identity()
                    items.append((k.Cancel(tenant, queue, key), None))
                elif roll < 0.50:
                    tenant, queue, key = self._identity()
                    reschedule = k.Reschedule(
                        tenant, queue, key, f"r{rng.randrange(3)}", delay_ms=self._delay()
                    )
                    items.append((reschedule, None))
                elif roll < 0.75 and due:
                    work = rng.choice(due)
                    message = base.get(Table.MESSAGES, work.message_id.encode())
                    assert isinstance(message, Message)
                    if message.expire_at_ms <= earliest_ms:
                        items.append((self._expire(message, interval), None))
                    else:
                        items.append((self._admission(message, interval), None))
                elif roll < 0.95 and open_obligations:
                    attempt_id, obligation = rng.choice(open_obligations)
                    items.append((self._outcome(attempt_id, obligation, now_ms), None))
                elif roll < 0.97 and due:
                    message = base.get(Table.MESSAGES, rng.choice(due).message_id.encode())
                    assert isinstance(message, Message)
                    claim_result = k.ClaimResult(
                        message.message_id,
                        message.generation,
                        message.version,
                        f"claim-{self.seq}",
                        "payload_missing",
                    )
                    items.append((claim_result, None))
                elif roll < 0.99:
                    gate = k.LaneGate(
                        TENANT, rng.choice(QUEUES), "CLOSED" if rng.random() < 0.3 else "OPEN"
                    )
                    items.append((gate, None))
                else:
                    items.append(self._schedule())
        return items

    def _delay(self) -> int:
        return self.rng.choice((0, 1, 200, 1_000, 2_500, 6_000))

    def _schedule(self) -> Appendable:
        tenant, queue, key = self._identity()
        payload = self.rng.choice(PAYLOADS)
        record = k.Schedule(
            tenant,
            queue,
            key,
            f"t{self.rng.randrange(3)}",
            digest_of(payload),
            len(payload),
            delay_ms=self._delay(),
        )
        return record, payload

    def _admission(self, message: Message, interval: k.TrustedInterval) -> k.PublishAdmission:
        self.seq += 1
        return k.PublishAdmission(
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            attempt_id=f"{attempt_prefix(message.message_id, message.generation)}{self.seq}",
            claim_id=f"claim-{self.seq}",
            owner="worker",
            descriptor_hash=f"desc-{message.generation}",
            capability=message.capability,
            interval=interval,
            capacity=k.Capacity(True),
        )

    def _expire(self, message: Message, interval: k.TrustedInterval) -> k.Expire:
        return k.Expire(message.message_id, message.generation, message.version, interval)

    def _outcome(self, attempt_id: str, obligation: Obligation, now_ms: int) -> k.PublishOutcome:
        self.seq += 1
        result: k.Published | k.NotPublished | k.Unknown
        roll = self.rng.random()
        if roll < 0.5:
            result = k.Published(k.Evidence(obligation.destination, 0, self.seq, now_ms))
        elif roll < 0.7:
            result = k.NotPublished("retriable", "broker_down")
        elif roll < 0.8:
            result = k.NotPublished("permanent", "record_too_large")
        elif roll < 0.85:
            result = k.NotPublished("lane_unavailable", "lane_closed")
        else:
            result = k.Unknown("timeout")
        return k.PublishOutcome(attempt_id, obligation.message_id, obligation.generation, result)

    def step(
        self, store: ShardStore, acked: Callable[[ShardStore, list[LogEntry]], None] | None = None
    ) -> None:
        """Append one batch, then apply some or all of what is pending; or do both at once
        in one group commit. `acked` hears of each durable write once it returned."""
        now_ms = self.tick()
        items = self.batch(store, now_ms)
        roll = self.rng.random()
        told = acked or (lambda _store, _entries: None)
        if roll < 0.3:
            entries, _ = store.commit(items, now_ms)
            told(store, entries)
            return
        told(store, store.append(items, now_ms))
        if roll < 0.4:
            return  # leave an unapplied tail for a while
        if roll < 0.6:
            store.apply_pending()
            told(store, [])
            return
        while store.apply_pending():
            told(store, [])


def entry_digest(entry: LogEntry) -> str:
    return hashlib.sha256(encode_entry(entry)).hexdigest()[:16]


def check_reopened(path: str, where: str) -> int:
    """Reopen after a kill and compare the store with the replay of its durable log: dense,
    persistence times never going back, the materialized state equal to the log's replay up
    to the applied position, payload bytes, the lane index and the story index exact.
    Returns the applied position."""
    with ShardStore.open(path, config=CONFIG) as store:
        applied = store.meta.position
        entries = list(store.iter_log())
        positions = [e.position for e in entries]
        assert positions == list(range(1, store.log_last_position + 1)), f"{where}: log not dense"
        assert applied <= store.log_last_position, where
        times = [e.persisted_at_ms for e in entries]
        assert times == sorted(times), f"{where}: persisted_at_ms went backwards in the log"
        _, result = replay(entries[:applied], CONFIG)
        with store.state_view() as state:
            live = state_digest(state)
            assert state.meta.position == applied, where
        assert result.position == applied, where
        assert live == result.digest, (
            f"{where}: store at position {applied} differs from the replay of its log"
        )
        problems = store_problems(store)
        # The story is written in the fold's transaction: exactly the folded entries' marks.
        problems += story_problems(store, rule_marks(entries[:applied], CONFIG))
        assert not problems, f"{where}: {problems}"
        return applied


def store_problems(store: ShardStore) -> list[str]:
    """What is wrong with the store's derived data: payload bytes and the lane index."""
    return payload_bytes_problems(store) + lane_index_problems(store)


def lane_index_problems(store: ShardStore) -> list[str]:
    """The per-lane timeline index holds exactly one key per timeline row."""
    env = store.env
    with env.env.begin() as txn, txn.cursor(db=env.lane_timeline) as cursor:
        index = {key for key, _ in cursor}
    with store.read() as base:
        expected = {
            lane_index_key(work.tenant, work.queue, key)
            for key, work in base.items(Table.TIMELINE)
            if isinstance(work, TimelineWork)
        }
    problems = [f"timeline row {key.hex()} missing from the lane index" for key in expected - index]
    problems += [f"lane index key {key.hex()} names no timeline row" for key in index - expected]
    return problems


def payload_bytes_problems(store: ShardStore) -> list[str]:
    """Payload bytes must be kept exactly while needed: every referenced digest has bytes
    (the workload always sends them), and bytes nobody references are only kept while an
    unapplied schedule names them."""
    env = store.env
    problems: list[str] = []
    applied = store.meta.position
    with env.env.begin() as txn:
        blobs: dict[str, PayloadBlob] = {}
        with txn.cursor(db=env.payload_bytes) as cursor:
            for key, raw in cursor:
                digest = key.decode()
                blobs[digest] = decode_struct(PayloadBlob, raw, env.data_file, digest)
        with store.read() as base:
            refs = {
                key.decode(): value
                for key, value in base.items(Table.PAYLOADS)
                if isinstance(value, PayloadRef)
            }
    for digest, ref in refs.items():
        blob = blobs.get(digest)
        if blob is None:
            problems.append(f"payload {digest[:12]} referenced {ref.count}x but its bytes are gone")
        elif digest_of(blob.data) != digest or len(blob.data) != ref.size:
            problems.append(f"payload {digest[:12]} bytes do not match their digest or size")
    for digest, blob in blobs.items():
        if digest not in refs and blob.last_ref_position <= applied:
            problems.append(f"payload {digest[:12]} kept although nothing can need it")
    return problems


def _die_at(spec: str) -> Callable[[str], None]:
    step, _, nth = spec.partition(":")
    left = [int(nth or "1")]

    def hook(name: str) -> None:
        if name != step:
            return
        left[0] -= 1
        if left[0] == 0:
            print(f"dying {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _print_ack(store: ShardStore, entries: list[LogEntry]) -> None:
    appended = " ".join(f"{e.position}:{entry_digest(e)}" for e in entries)
    print(f"ack {store.meta.position} {store.log_last_position} {appended}".rstrip(), flush=True)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.crash_worker")
    parser.add_argument("path")
    parser.add_argument("seed", type=int)
    parser.add_argument("--acks", action="store_true")
    parser.add_argument("--no-sync", action="store_true")
    parser.add_argument("--die-at", default=None)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv[1:])
    rng = random.Random(args.seed)
    options = StoreOptions(max_batch_entries=rng.choice((1, 4, 16, 128)), sync=not args.no_sync)
    deadline = time.monotonic() + WORKER_DEADLINE_S
    with ShardStore.open(args.path, config=CONFIG, options=options) as store:
        workload = Workload(
            rng, max(T0_MS, store.log_last_persisted_at_ms), store.log_last_position
        )
        if args.die_at:
            store.fault_hook = _die_at(args.die_at)
        acked = _print_ack if args.acks else None
        print("ready", flush=True)
        steps = 0
        while time.monotonic() < deadline:
            if args.steps is not None and steps >= args.steps:
                time.sleep(0.05)  # done: wait to be killed
                continue
            workload.step(store, acked)
            steps += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
