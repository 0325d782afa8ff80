"""The catalogue of safety mutants `python -m bench.mutation` applies (data, not code).

Each mutant is a deliberate bug in one of the rules Nereus promises never to break: one or
more edits, each an exact snippet of a source file and what replaces it, the promise it
breaks (RELIABILITY.md's P-numbers), and the tests expected to catch it. A snippet must occur
exactly once in its file, or the run stops before anything is mutated
(`tests/project/test_mutation.py` checks that in every suite run): a refactor that moves or rewrites
the code a mutant targets must retarget the mutant, never silently disable it.

Grouped by where the code lives: the kernel's time rules and lifecycle, the runtime's send
gate and recovery, the stores' durability and transaction boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    file: str  # relative to the repository root
    snippet: str  # must occur exactly once in the file
    replacement: str


@dataclass(frozen=True)
class Mutant:
    id: str
    what: str  # the bug, in a few words
    promise: str  # the never-rule it breaks
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest arguments: the tests relevant to this mutant
    # A narrower set for the quick run (CI), stopping at the first failure; empty: the
    # mutant is not in the quick run.
    quick_tests: tuple[str, ...] = ()
    # Run with the Rust module built from the mutated tree (`NEREUS_PURE_PYTHON=rust`): a
    # mutant of the crate, or of Python that runs only beside it (the compiled folds).
    rust: bool = False


def one(file: str, snippet: str, replacement: str) -> tuple[Edit, ...]:
    return (Edit(file, snippet, replacement),)


# Cheap files first: a full run stops a mutant once two files have caught it.
KERNEL_TESTS = (
    "tests/kernel/test_timing_props.py",
    "tests/kernel/test_codes.py",
    "tests/runtime/test_runtime_discovery.py",
    "tests/kernel/test_lifecycle_table.py",
    "tests/kernel/test_publish_safety.py",
    "tests/kernel/test_state_machine.py",
    "tests/sim/test_simulator.py",
)
RUNTIME_TESTS = (
    "tests/runtime/test_runtime_discovery.py",
    "tests/runtime/test_runtime_recovery.py",
    "tests/adapters/local/test_embedded_api.py",
    "tests/runtime/test_dead_letters.py",
    "tests/sim/test_simulator.py",
)
STORAGE_TESTS = (
    "tests/storage/test_storage_steps.py",
    "tests/storage/test_storage_durability.py",
    "tests/adapters/local/test_library_durability.py",
    "tests/storage/test_storage_crash.py",
    "tests/storage/test_storage_store.py",
)

TIMING = "kernel/timing.py"
MUTATIONS = "kernel/mutations.py"
RULES = "kernel/rules.py"
STORE = "storage/store.py"
FOLD = "storage/fold.py"
MAINTENANCE = "storage/maintenance.py"

TIME_RULES = (
    Mutant(
        "T1",
        "decide() expires when the latest end reaches expireAt",
        "P2 never expired early",
        one(
            TIMING,
            "    if interval.earliest_ms >= expire_at_ms:",
            "    if interval.latest_ms >= expire_at_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T2",
        "decide() pauses only once latest is past expireAt (admits at latest == expireAt)",
        "no Admission unless latest < expireAt",
        one(
            TIMING,
            "    if interval.latest_ms >= expire_at_ms:",
            "    if interval.latest_ms > expire_at_ms:",
        ),
        KERNEL_TESTS,
        quick_tests=("tests/kernel/test_timing_props.py",),
    ),
    Mutant(
        "T3",
        "decide() admits when the latest end reaches actionAt",
        "P1 never early",
        one(
            TIMING,
            "    if interval.earliest_ms >= action_at_ms:",
            "    if interval.latest_ms >= action_at_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T4",
        "decide() admits 1 ms before the earliest end reaches actionAt",
        "P1 never early",
        one(
            TIMING,
            "    if interval.earliest_ms >= action_at_ms:",
            "    if interval.earliest_ms + 1 >= action_at_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T5",
        "the delivery window is measured from deliverAt alone, not max(deliverAt, bp)",
        "V1 timing: expireAt >= max(deliverAt, bp) + minDeliveryWindow",
        one(
            TIMING,
            "if expire_at_ms < max(deliver_at_ms, bp_ms) + limits.min_delivery_window_ms:",
            "if expire_at_ms < deliver_at_ms + limits.min_delivery_window_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T6",
        "the delay horizon is exceeded by up to one delivery window",
        "V1 timing: deliverAt <= bp + maxDelayHorizon",
        one(
            TIMING,
            "if deliver_at_ms > bp_ms + limits.max_delay_horizon_ms:",
            "if deliver_at_ms > bp_ms + limits.max_delay_horizon_ms"
            " + limits.min_delivery_window_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T7",
        "the message lifetime is exceeded by 1 ms",
        "V1 timing: expireAt <= bp + maxMessageLifetime",
        one(
            TIMING,
            "if expire_at_ms > bp_ms + limits.max_message_lifetime_ms:",
            "if expire_at_ms > bp_ms + limits.max_message_lifetime_ms + 1:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "T8",
        "a batch is stamped with the tick's opening reading, taken before its commands arrived",
        "bp is read after arrival: deliverAt >= send + delay; no Admission persisted past expireAt",
        one(
            "runtime/shard.py",
            "        return max(tick.now.now_ms, self.clock.now_ms())",
            "        return tick.now.now_ms",
        ),
        ("tests/runtime/test_persistence_time.py", "tests/sim/test_simulator.py"),
        quick_tests=("tests/runtime/test_persistence_time.py",),
    ),
)

ADMISSION_CHECKS = (
    Mutant(
        "A1",
        "an Admission persisted exactly at expireAt qualifies",
        "no Admission unless persisted before expireAt",
        one(
            MUTATIONS,
            "        elif step.bp_ms >= message.expire_at_ms:",
            "        elif step.bp_ms > message.expire_at_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "A2",
        "an Admission persisted 1 ms before the action time qualifies",
        "P1 never early",
        one(
            MUTATIONS,
            "        elif step.bp_ms < message.action_at_ms:",
            "        elif step.bp_ms < message.action_at_ms - 1:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "A3",
        "an Admission's clock evidence is accepted unless it says EXPIRE (WAIT, PAUSE pass)",
        "P1 never early",
        one(
            MUTATIONS,
            "decide(r.interval, message.action_at_ms, message.expire_at_ms) is not _ADMIT",
            "decide(r.interval, message.action_at_ms, message.expire_at_ms) is Decision.EXPIRE",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "A4",
        "a CLOSED lane gate does not stop Admission",
        "no Admission through a closed gate",
        one(
            MUTATIONS,
            "        elif _lane_closed(step, message):\n"
            "            code = Code.ADMISSION_LANE_CLOSED",
            "        elif False:\n            code = Code.ADMISSION_LANE_CLOSED",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "A5",
        "an Admission built on an older version of the generation still qualifies",
        "Admission only on the state it was prepared against",
        one(
            MUTATIONS,
            "    elif not _matches(message, r.generation, r.version):\n"
            "        code = Code.ADMISSION_STALE",
            "    elif message is None or message.generation != r.generation:\n"
            "        code = Code.ADMISSION_STALE",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "A6",
        "an Admission repeating an existing attempt id is not refused",
        "P5 one attempt, one obligation",
        one(MUTATIONS, "    if step.attempt(r.attempt_id) is not None:", "    if False:"),
        KERNEL_TESTS,
    ),
    Mutant(
        "A7",
        "a cancel whose verdict changes state is taken for one that changes nothing, so a "
        "pending timer's cancel is answered from the snapshot without an entry (embedded) "
        "or refused as rate limited (Kafka mode)",
        "a pending timer's cancel always goes through and is never refused (issue 31, item 2)",
        one(
            "runtime/absent.py",
            "    if not changes_nothing(before, after, effects, len(cancels)):",
            "    if False:",
        ),
        (
            "tests/runtime/test_cancel_rate.py",
            "tests/adapters/http/test_http_abuse.py",
            "tests/runtime/test_absent_cancel.py",
            "tests/adapters/kafka/test_kafka_cancel_rate.py",
        ),
    ),
    Mutant(
        "E1",
        "an expiry is accepted once the latest end reaches expireAt",
        "P2 never expired early",
        one(
            MUTATIONS,
            "        elif r.interval.earliest_ms < message.expire_at_ms:",
            "        elif r.interval.latest_ms < message.expire_at_ms:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "E2",
        "an expiry persisted 1 ms before expireAt is accepted",
        "P2 never expired early",
        one(
            MUTATIONS,
            "        elif step.bp_ms < message.expire_at_ms:",
            "        elif step.bp_ms < message.expire_at_ms - 1:",
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "O1",
        "a proof of absence under another producer's fence is accepted",
        "P12 absence only with proof",
        one(
            MUTATIONS,
            "and (attempt.fence_id is None or result.proof.fence_id != attempt.fence_id)",
            "and attempt.fence_id is None",
        ),
        KERNEL_TESTS,
    ),
)

LIFECYCLE_ROWS = (
    Mutant(
        "L1",
        "a cancel after Admission (PUBLISHING, UNCERTAIN, DELIVERED) cancels",
        "P4 too_late after Admission; nothing hidden",
        one(
            RULES,
            '*(Rule("cancel", st, ANY, Code.TOO_LATE, SAME) for st in (P, U, D)),',
            '*(Rule("cancel", st, ANY, Code.CANCELED, C) for st in (P, U, D)),',
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "L2",
        "a changed schedule of a PUBLISHING timer supersedes it",
        "P4 too_late after Admission",
        one(
            RULES,
            'Rule("schedule", P, "changed", Code.TOO_LATE, SAME),',
            'Rule("schedule", P, "changed", Code.RESCHEDULED, S, True),',
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "L3",
        "an unarmed UNCERTAIN message is admitted again (retries unbounded)",
        "P5 at most max_uncertain_retries duplicates",
        one(
            RULES,
            'Rule("admission", U, "unarmed", Code.ADMISSION_STALE, SAME),',
            'Rule("admission", U, "unarmed", Code.ADMITTED, P),',
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "L4",
        "expiry of an armed UNCERTAIN message marks it EXPIRED",
        "P4 an UNCERTAIN generation keeps its open obligation",
        one(
            RULES,
            'Rule("expire", U, "armed", Code.RETRY_WINDOW_CLOSED, SAME),',
            'Rule("expire", U, "armed", Code.EXPIRED, E),',
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "L5",
        "an UNKNOWN outcome leaves the message SCHEDULED, as if nothing was sent",
        "P5 duplicates only behind a recorded UNKNOWN (UNCERTAIN)",
        one(
            RULES,
            'Rule("outcome_unknown", P, ANY, Code.OUTCOME_RECORDED, U),',
            'Rule("outcome_unknown", P, ANY, Code.OUTCOME_RECORDED, S),',
        ),
        KERNEL_TESTS,
    ),
    Mutant(
        "L6",
        "NOT_PUBLISHED is recorded for an UNKNOWN attempt",
        "P6 UNKNOWN resolved only by positive evidence",
        one(
            RULES,
            'AttemptRule("UNKNOWN", "NOT_PUBLISHED", Code.OUTCOME_ABSENCE_NOT_EVIDENCE, SAME),',
            'AttemptRule("UNKNOWN", "NOT_PUBLISHED", Code.OUTCOME_RECORDED, "NOT_PUBLISHED"),',
        ),
        KERNEL_TESTS,
        quick_tests=("tests/kernel/test_lifecycle_table.py",),
    ),
)

# runtime/shard.py before issue 18's split: retarget these after that merge.
SHARD = "runtime/shard.py"
RECOVERY = "runtime/recovery.py"
RUNTIME = (
    Mutant(
        "G1",
        "the send gate checks the interval's latest end instead of its earliest",
        "P1 sent only while the clock proves the action time",
        one(
            "runtime/claims.py",
            "return interval.earliest_ms >= action_at_ms",
            "return interval.latest_ms >= action_at_ms",
        ),
        RUNTIME_TESTS,
        quick_tests=("tests/runtime/test_runtime_discovery.py",),
    ),
    Mutant(
        "G2",
        "the send gate trusts the tick's reading, taken before the Admission's commit",
        "P1 sent only while the clock proves the action time",
        one(
            SHARD,
            "after = read_clock(self.clock)  # the send's own reading, after the commit\n"
            "        self._send(tick, after)",
            "after = now\n        self._send(tick, after)",
        ),
        RUNTIME_TESTS,
    ),
    Mutant(
        "R1",
        "recovery takes an unfenced attempt nobody found for NOT_PUBLISHED",
        "P12 absence only with proof",
        one(
            RECOVERY,
            'return Unknown("send_gate_lost", "the owner restarted before this attempt'
            "'s outcome\")",
            'return NotPublished("retriable", "send_gate_lost")',
        ),
        RUNTIME_TESTS,
    ),
    Mutant(
        "R2",
        "recovery forgets the attempts that were PUBLISHING at the crash",
        "P4 nothing lost; P11 recovery settles every attempt",
        one(
            RECOVERY,
            "wants = self._open_attempts(view, AttemptStatus.PUBLISHING)",
            "wants = []",
        ),
        RUNTIME_TESTS,
    ),
    Mutant(
        "R3",
        "an incomplete search after the fence is taken as a proof of absence",
        "P12 absence only with proof",
        one(
            "runtime/destination.py",
            "or fence.fence_id != fence_id or not self.complete:",
            "or fence.fence_id != fence_id:",
        ),
        RUNTIME_TESTS,
    ),
)

STORAGE = (
    Mutant(
        "S1",
        "the shard store is opened without fsync",
        "P3 durable before acted on; acknowledged means durable",
        one(MAINTENANCE, "        sync=options.sync,", "        sync=False,"),
        STORAGE_TESTS,
        quick_tests=("tests/storage/test_storage_durability.py",),
    ),
    Mutant(
        "S2",
        "the store's meta page is written without a synchronous write",
        "P3 durable before acted on",
        one("storage/env.py", "            metasync=sync,", "            metasync=False,"),
        STORAGE_TESTS,
    ),
    Mutant(
        "S3",
        "the local destination writes without fsync",
        "P6 PUBLISHED only with evidence of a record that is there",
        one(
            "adapters/local/destination.py",
            "max_dbs=8, sync=sync,",
            "max_dbs=8, sync=False,",
        ),
        STORAGE_TESTS,
    ),
    Mutant(
        "B1",
        "the group commit appends and folds in two transactions",
        "P7 a write is all or nothing; replay agrees",
        one(
            STORE,
            '            self._at("append")\n            results, meta, _ = fold_in(',
            '            self._at("append")\n'
            "        with env.env.begin(write=True) as txn:\n"
            "            results, meta, _ = fold_in(",
        ),
        STORAGE_TESTS,
    ),
    Mutant(
        "B2",
        "the applied position (ShardMeta) is written in a transaction of its own",
        "P7 a write is all or nothing; replay agrees",
        (
            Edit(
                FOLD,
                "    txn.put(SHARD_META_KEY, encode_value(state.meta), db=env.meta)\n"
                '    at("meta")',
                '    at("meta")',
            ),
            Edit(
                STORE,
                '        self._at("sync")\n'
                "        self._appended(entries)\n        self.meta = meta\n",
                "        with env.env.begin(write=True) as txn:\n"
                "            txn.put(_META_KEY, encode_value(meta), db=env.meta)\n"
                '        self._at("sync")\n'
                "        self._appended(entries)\n        self.meta = meta\n",
            ),
            Edit(
                STORE,
                '        self._at("sync")\n        self._appended(logged)\n',
                "        with env.env.begin(write=True) as txn:\n"
                "            txn.put(_META_KEY, encode_value(meta), db=env.meta)\n"
                '        self._at("sync")\n        self._appended(logged)\n',
            ),
            # The mutated store names the meta's key itself (the fold does, unmutated).
            Edit(
                STORE,
                "__all__ = [",
                "from nereus.storage.schema import SHARD_META_KEY as _META_KEY\n__all__ = [",
            ),
        ),
        STORAGE_TESTS,
        quick_tests=("tests/storage/test_storage_steps.py",),
    ),
)

# The batch records and the decoded-row memo (issue 19): a batch must mean its items, and
# the memo must never answer bytes nobody checked.
BATCHES = (
    Mutant(
        "M1",
        "a batch item's effects are dropped when the next item begins",
        "P3/P4 what the log admitted is sent (a batch is its items)",
        one("kernel/step.py", "            self.done.extend(self.effects)\n", ""),
        (
            "tests/kernel/test_batch_records.py",
            "tests/runtime/test_runtime_discovery.py",
            *KERNEL_TESTS,
        ),
        quick_tests=("tests/kernel/test_batch_records.py",),
    ),
    Mutant(
        "M2",
        "the row memo answers bytes that only share a checksum with a row it checked",
        "P8 a damaged store is refused, never read as a plausible row",
        one(
            "storage/codec.py",
            "        return found[1] if found[0] == data else None",
            "        return found[1]",
        ),
        (
            "tests/storage/test_storage_memo.py",
            "tests/storage/test_storage_corrupt.py",
            *STORAGE_TESTS,
        ),
    ),
    Mutant(
        "F1",
        "the framing check accepts any value at least a checksum long (the Python reference)",
        "P8 a damaged store is refused, never read as a plausible row",
        one(
            "kernel/native.py",
            '    return len(data) >= 4 and zlib.crc32(data[4:]).to_bytes(4, "big") == data[:4]',
            "    return len(data) >= 4",
        ),
        (
            "tests/kernel/test_native.py",
            "tests/storage/test_storage_corrupt.py",
            "tests/storage/test_storage_memo.py",
            *STORAGE_TESTS,
        ),
    ),
    Mutant(
        "F2",
        "a payload digest in upper-case hex passes the reference check",
        "P8 an invalid command is refused with a code from the closed list",
        one(
            "kernel/native.py",
            '_SHA256_HEX = re.compile("[0-9a-f]{64}")',
            '_SHA256_HEX = re.compile("[0-9a-fA-F]{64}")',
        ),
        ("tests/kernel/test_native.py", "tests/kernel/test_codes.py"),
    ),
    Mutant(
        "F3",
        "message ids are hashed without their personalisation (the Python reference)",
        "P7 replay agrees: a message id never changes between versions",
        one(
            "kernel/native.py",
            "    return hashlib.blake2b(data, digest_size=digest_size, person=person).hexdigest()",
            "    return hashlib.blake2b(data, digest_size=digest_size).hexdigest()",
        ),
        (
            "tests/kernel/test_native.py",
            "tests/kernel/test_message_ids.py",
            "tests/replay/test_golden_logs.py",
        ),
    ),
    Mutant(
        "M3",
        "every command of a client's batch is answered with the batch's first outcome",
        "P7 replay agrees: each command is answered with what the log decided for it",
        one(
            "runtime/shard.py",
            "answers.append(outcomes[entries[at].position][index])",
            "answers.append(outcomes[entries[at].position][0])",
        ),
        (
            "tests/kernel/test_batch_records.py",
            "tests/adapters/http/test_http_e2e.py",
            "tests/sim/test_simulator.py",
        ),
    ),
)

# Issue 30, item 5 (rules 5-8): rules an outside review broke without any test noticing.
CLOCK_TESTS = ("tests/runtime/test_runtime_clock.py", "tests/adapters/test_clock_props.py")
SNAPSHOT_TESTS = (
    "tests/storage/test_storage_snapshot.py",
    "tests/storage/test_snapshot_durability.py",
)
LMDBCHECK_TESTS = (
    "tests/storage/test_storage_corrupt.py",
    "tests/storage/test_storage_lmdbcheck.py",
)
GRANT_TESTS = ("tests/adapters/http/test_http_auth.py", "tests/adapters/http/test_http_hostile.py")
GUARDS_ISSUE30_B = (
    Mutant(
        "G5",
        "the system clock's interval is not widened by drift since its last sample",
        "P1/P2 the trusted interval contains true time (never early, never expired early)",
        one(
            "adapters/clock.py",
            "error_ns = sample.error_ns + int(elapsed_ns * self.drift_ppm / 1_000_000)",
            "error_ns = sample.error_ns",
        ),
        CLOCK_TESTS,
        quick_tests=("tests/adapters/test_clock_props.py",),
    ),
    Mutant(
        "G5b",
        "the system clock rounds its earliest end up to the next millisecond",
        "P1/P2 the trusted interval contains true time (never early, never expired early)",
        one(
            "adapters/clock.py",
            "(now_ns - error_ns) // 1_000_000, -((-(now_ns + error_ns)) // 1_000_000)",
            "-((-(now_ns - error_ns)) // 1_000_000), -((-(now_ns + error_ns)) // 1_000_000)",
        ),
        CLOCK_TESTS,
    ),
    Mutant(
        "G6",
        "a snapshot file is renamed into place without an fsync of its contents",
        "P3 acknowledged means durable (a snapshot is whole or not there)",
        one(
            "storage/snapshot.py",
            "            f.flush()\n            os.fsync(f.fileno())\n",
            "            f.flush()\n",
        ),
        SNAPSHOT_TESTS,
    ),
    Mutant(
        "G7",
        "the pre-open check accepts a data file cut by exactly its last page",
        "P8 a truncated store is refused naming the file, never a SIGBUS",
        one(
            "storage/lmdbcheck.py",
            "    if size >= (meta.last_pg + 1) * meta.psize:",
            "    if size >= meta.last_pg * meta.psize:",
        ),
        LMDBCHECK_TESTS,
    ),
    Mutant(
        "G8",
        "the admin block route needs the produce grant instead of admin",
        "P10 a credential does only what its grants allow",
        one(
            "adapters/http/contract.py",
            '        "/api/v1/admin/block",\n        "admin",\n',
            '        "/api/v1/admin/block",\n        "produce",\n',
        ),
        GRANT_TESTS,
    ),
)

# Issue 30, item 5 (rules 1-4 and 9): the send lease, and what an evidence search may prove.
# G1 and G2 were taken (the send gate), so rules 1 and 2 are G1b and G2b.
EVIDENCE = "adapters/kafka/evidence.py"
# The rule without a broker first, then the runtime against the real one.
SETTLE_TESTS = ("tests/runtime/test_runtime_settle.py", "tests/adapters/kafka/test_kafka_settle.py")
EVIDENCE_TESTS = (
    "tests/adapters/kafka/test_kafka_evidence.py",
    "tests/adapters/kafka/test_kafka_settle.py",
)
GUARDS_ISSUE30_A = (
    Mutant(
        "G1b",
        "an admitted attempt is sent although the shard log no longer proves ownership",
        "P3/P5 a send only while this owner holds the shard (the send lease)",
        one(SHARD, "if ready and self.shard_log.send_allowed():", "if ready:"),
        ("tests/runtime/test_runtime_lease.py", "tests/adapters/kafka/test_kafka_lease.py"),
        quick_tests=("tests/runtime/test_runtime_lease.py",),
    ),
    Mutant(
        "G2b",
        "an incomplete search counts as the look before an uncertain retry",
        "P5 duplicates only behind a recorded UNKNOWN, never past a record not looked for",
        one(
            RECOVERY,
            "            if settled.complete:\n"
            "                self._looked[aid] = settled.started_ms",
            "            self._looked[aid] = settled.started_ms",
        ),
        SETTLE_TESTS,
        quick_tests=(
            "tests/runtime/test_runtime_settle.py::"
            "test_an_incomplete_search_is_not_the_look_before_an_uncertain_retry",
        ),
    ),
    Mutant(
        "G3",
        "a Kafka search cut short by its bounds or cancelled reports itself complete",
        "P12 absence only with proof (a complete read after the fence)",
        one(EVIDENCE, "complete = not ends or len(found) == len(wanted)", "complete = True"),
        EVIDENCE_TESTS,
    ),
    Mutant(
        "G4",
        "a Kafka search starts at the admission time, without the clock slack",
        "P12 absence only with proof (a record stamped before its admission is still read)",
        one(
            EVIDENCE,
            "from_ms = max(since_ms - self._limits.slack_ms, 0)",
            "from_ms = max(since_ms, 0)",
        ),
        EVIDENCE_TESTS,
    ),
    Mutant(
        "G9",
        "a search's proof of absence is keyed to the destination's current fence",
        "P12 absence only with proof (under the attempt's own fence)",
        one(
            "runtime/settle.py",
            "proof = outcome.proof_for(want.fence_id, aid) if evidence is None else None",
            "proof = outcome.proof_for(self.destination.fence_id, aid)"
            " if evidence is None else None",
        ),
        SETTLE_TESTS,
        quick_tests=(
            "tests/runtime/test_runtime_settle.py::test_the_settler_keys_every_proof_to_the_attempts_fence",
        ),
    ),
)

# Issue 30, item 4: a Pulsar record's evidence time is never earlier than its own send.
PULSAR_EVIDENCE = (
    Mutant(
        "R4",
        "a Pulsar search stamps a batched record with its batch's publish time",
        "P6 evidence is the record's own (never earlier than its send: no false early_delivery)",
        one(
            "adapters/pulsar/stamps.py",
            "own_ms = max(sent_ms, publish_ms)",
            "own_ms = publish_ms",
        ),
        (
            "tests/adapters/pulsar/test_pulsar_stamps.py",
            "tests/adapters/pulsar/test_pulsar_evidence.py",
        ),
    ),
)

# A Pulsar delayed send never makes a batch vanish (specs/pulsar.md, "Delayed and ordinary
# sends on one topic").
PULSAR_SENDS = (
    Mutant(
        "R5",
        "a handed-off send goes through its topic's batching producer, with the ordinary ones",
        "P4/P6 a delayed send never makes a batch vanish (no Ok without a position, no UNKNOWN)",
        one(
            "adapters/pulsar/destination.py",
            "which = (p.topic, reveal_ms is not None)",
            "which = (p.topic, False)",
        ),
        (
            "tests/adapters/pulsar/test_pulsar_destination.py",
            "tests/adapters/pulsar/test_pulsar_mixed_sends.py",
        ),
    ),
)

# Issue 30, item 2: one owner per store.
STORE_LOCK = (
    Mutant(
        "K1",
        "the directory lock is taken shared, so a second writer gets it too",
        "one owner per store: a second opener of a data directory or shard store is refused",
        one(
            "storage/lock.py",
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        ),
        ("tests/storage/test_storage_lock.py", "tests/storage/test_store_lock.py"),
    ),
    Mutant(
        "O2",
        "the local destination proves absent an attempt admitted after it took the lock",
        "P12 absence only with proof (never of an attempt the fencing writer may still send)",
        one(
            "adapters/local/destination.py",
            "lk.attempt_id for lk in lookups if lk.since_ms >= fence.fenced_at_ms",
            "lk.attempt_id for lk in lookups if lk.since_ms >= fence.fenced_at_ms + 10**12",
        ),
        (
            "tests/adapters/local/test_local_fence.py",
            "tests/adapters/local/test_local_fence_runtime.py",
        ),
    ),
    Mutant(
        "O3",
        "the local destination's search reads its index while a send of its own is half done",
        "P12 absence only with proof (never of a record a send in progress is writing)",
        one(
            "adapters/local/destination.py",
            "with self._writing:  # no send of this instance is half done while the index is read",
            "if True:",
        ),
        (
            "tests/adapters/local/test_local_fence.py",
            "tests/adapters/local/test_local_fence_runtime.py",
        ),
    ),
)

# Issue 31, item 5: sealed at rest, private files.
AT_REST = (
    Mutant(
        "Z1",
        "an encrypted queue's headers are sealed in the envelope and also kept in the record",
        "an encrypted queue's headers are never at rest in clear (store, snapshots, exports)",
        one(
            "adapters/http/writes.py",
            "headers, encrypted = (() if sealed else headers), True",
            "encrypted = True",
        ),
        ("tests/adapters/http/test_http_encryption.py", "tests/storage/test_file_modes.py"),
    ),
    Mutant(
        "Z2",
        "the shard store's LMDB files are created with py-lmdb's default mode (0644 after LMDB)",
        "what Nereus creates under a data directory is 0600/0700 unless configured",
        one(
            "storage/env.py",
            "mode=files.file_mode(),  # data.mdb",
            "# data.mdb",
        ),
        (
            "tests/storage/test_file_modes.py",
            "tests/adapters/cli/test_cli_data_dirs.py",
            "tests/storage/test_store_lock.py",
        ),
    ),
    Mutant(
        "Z3",
        "directories are made with the process's default mode (0777 less the umask)",
        "what Nereus creates under a data directory is 0600/0700 unless configured",
        one("storage/files.py", "os.mkdir(directory, mode)", "os.mkdir(directory)"),
        (
            "tests/storage/test_file_modes.py",
            "tests/adapters/cli/test_cli_data_dirs.py",
            "tests/storage/test_store_lock.py",
        ),
    ),
)

# Issue 31, item 4: a tenant's deliveries are its own (specs/destinations.md).
TENANT_TOPIC_TESTS = (
    "tests/adapters/test_tenant_topics.py",
    "tests/adapters/http/test_http_tenant_topics.py",
)
TENANT_TOPICS = (
    Mutant(
        "N1",
        "the local destination names a tenant's topic by its queue alone",
        "P10 a tenant's deliveries are its own: no consumer reads another tenant's records",
        one(
            "adapters/tenant_topics.py",
            "    if tenant == DEFAULT_TENANT:\n"
            "        return queue\n"
            '    return f"{tenant}{LOCAL_SEPARATOR}{queue}"',
            "    return queue",
        ),
        TENANT_TOPIC_TESTS,
        quick_tests=("tests/adapters/test_tenant_topics.py",),
    ),
    Mutant(
        "N2",
        "a broker topic two tenants reach is accepted at start without being declared shared",
        "P10 two tenants share a topic only where the operator declared it shared",
        one(
            "adapters/tenant_topics.py",
            "if len(users) > 1 and topic not in shared:",
            "if len(users) > 2 and topic not in shared:",
        ),
        ("tests/adapters/test_tenant_topics.py", "tests/adapters/kafka/test_kafka_config.py"),
    ),
    Mutant(
        "N3",
        "a delivered record does not name its tenant",
        "P10 every record names its tenant (a shared topic's consumer tells them apart by it)",
        one("runtime/prepare.py", "        (H_TENANT, message.tenant.encode()),\n", ""),
        (*TENANT_TOPIC_TESTS, "tests/sim/test_simulator.py"),
    ),
    Mutant(
        "N4",
        "a Kafka search for a tenant's topic skips the topic its queue had before the upgrade",
        "P12 absence only with proof (of the topic the attempt was sent to)",
        one(
            "adapters/kafka/destination.py",
            "return self._reader.search([*lookups, *self._legacy_lookups(lookups)], wake)",
            "return self._reader.search(lookups, wake)",
        ),
        ("tests/adapters/test_tenant_topics.py", "tests/adapters/kafka/test_kafka_tenants.py"),
    ),
)

# Issue 32, item 3: every delivered record names its timer (specs/destinations.md).
TIMER_KEYS = (
    Mutant(
        "H1",
        "a dead-letter copy does not carry its timer's key (nereus-timer-key)",
        "every record Nereus delivers, a dead-letter copy too, names its timer",
        one(
            "runtime/prepare.py",
            "        (H_TIMER_KEY, encode_timer_key(message.timer_key).encode()),\n",
            "        *([] if topic.endswith(DLQ_SUFFIX) else"
            " [(H_TIMER_KEY, encode_timer_key(message.timer_key).encode())]),\n",
        ),
        (
            "tests/runtime/test_timer_key.py",
            "tests/runtime/test_dead_letters.py",
            "tests/sim/test_simulator.py",
        ),
    ),
)

READINESS_TESTS = ("tests/service/test_readiness.py", "tests/adapters/cli/test_serve_clock.py")
READINESS = (
    Mutant(
        "W1",
        "readiness ignores a halted shard",
        "readiness never 200 while an owned shard is halted (specs/http.md)",
        one(
            "service/readiness.py",
            '        return [Reason(SHARD_HALTED, f"halted: {halted}", shard)]',
            "        return []",
        ),
        ("tests/service/test_readiness.py", "tests/adapters/kafka/test_kafka_readiness.py"),
    ),
    Mutant(
        "W2",
        "an unbounded clock is taken for a bounded one at start",
        "never start silently on a clock that cannot bound true time; never ready without a "
        "bound (specs/time.md)",
        one(
            "service/clock_bound.py",
            "    if clock.interval().bounded:",
            "    if clock.interval().bounded or True:",
        ),
        READINESS_TESTS,
    ),
)

# Issue 32, item 4: one code list and one result shape for the library, HTTP and Kafka RPC.
ONE_CODE_LIST = (
    Mutant(
        "C1",
        "a refusal in the library comes back without its words",
        "every refusal says why, in the same words on every surface",
        one(
            "service/results.py",
            "        message=explain(outcome, record, config, names),\n",
            "        message=None,\n",
        ),
        ("tests/service/test_result_codes.py", "tests/service/test_library_fuzz.py"),
        quick_tests=("tests/service/test_result_codes.py",),
    ),
    Mutant(
        "C2",
        "the HTTP edge answers a bad key with a code the library does not give",
        "the same bad command gets the same code from the library, HTTP and the Kafka RPC",
        one(
            "adapters/http/batch.py",
            'raise ApiError("invalid_identity", f"{where}: {problem}")',
            'raise ApiError("invalid_operation", f"{where}: {problem}")',
        ),
        ("tests/service/test_result_codes.py", "tests/adapters/http/test_http_e2e.py"),
    ),
)

CONSUMERS = (
    Mutant(
        "U1",
        "the async consumer counts a record handled when it hands it out",
        "P4 nothing lost: a record is committed only once the program handled it",
        one(
            "adapters/local/async_consumer.py",
            "        c._next = record.offset + 1\n        self._out = record\n",
            "        c._next = record.offset + 1\n"
            "        c._handled = max(c._handled, record.offset + 1)\n"
            "        self._out = record\n",
        ),
        (
            "tests/adapters/local/test_async_consumer.py",
            "tests/adapters/local/test_async_consumer_crash.py",
        ),
    ),
    Mutant(
        "U2",
        "the local destination's writer wakes only the consumers of its own process",
        "P4 nothing lost: a consumer in another process sees what was delivered without polling",
        one(
            "adapters/local/destination.py",
            "                notify(self.path)\n",
            "",
        ),
        ("tests/adapters/local/test_async_consumer.py", "tests/adapters/local/test_consumer.py"),
    ),
)

# The compiled folds of the fire's records (issue 34): each must write what the reducer
# writes, so each of these is caught by folding one log with and without them.
FOLD_TESTS = ("tests/storage/test_published_fold.py", "tests/storage/test_storage_contract.py")
ADMISSION_FOLD_TESTS = ("tests/storage/test_compiled_refusals.py", *FOLD_TESTS)
SCHEDULE_FOLD_TESTS = ("tests/storage/test_scheduled_fold.py", *FOLD_TESTS)
COMPILED_FOLDS: tuple[Mutant, ...] = (
    Mutant(
        "X1",
        "the compiled fold of a PUBLISHED outcome leaves its attempt counted open (Rust)",
        "P7 replay agrees: the compiled fold writes exactly what the reducer writes",
        one(
            "native/src/outcomes.rs",
            "            (M_OPEN_ATTEMPTS, rows::int(open - 1)),\n",
            "            (M_OPEN_ATTEMPTS, rows::int(open)),\n",
        ),
        FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X2",
        "the compiled fold admits a timer pinned to another capability (Rust)",
        "P1 never early: a handoff is sent only under the capability its timer was pinned to",
        one(
            "native/src/admissions.rs",
            "        && message.is(M_HAS_WORK, &[TRUE])\n"
            "        && message.is(M_CAPABILITY, &item.capability);\n",
            "        && message.is(M_HAS_WORK, &[TRUE]);\n",
        ),
        ADMISSION_FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X3",
        "the compiled fold admits an Admission persisted before its action time",
        "P1 never early: nothing is admitted before its action time",
        one(
            "storage/admitted.py",
            "        if not action_at_ms <= bp_ms < expire_at_ms:\n",
            "        if not bp_ms < expire_at_ms:\n",
        ),
        ADMISSION_FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X4",
        "the compiled fold admits into a closed lane",
        "P7 replay agrees: the compiled fold decides as the reducer (a closed lane admits nothing)",
        one(
            "storage/admitted.py",
            '        if isinstance(lane, Lane) and lane.gate == "CLOSED":\n',
            '        if isinstance(lane, Lane) and lane.gate == "SHUT":\n',
        ),
        ADMISSION_FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X5",
        "the compiled fold of a first schedule leaves the tenant's live count as it was (Rust)",
        "P7 replay agrees: the compiled fold writes exactly what the reducer writes",
        one(
            "native/src/schedules.rs",
            "            Some((live, bytes)) => (live + 1, bytes + size),\n",
            "            Some((live, bytes)) => (live, bytes + size),\n",
        ),
        SCHEDULE_FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X6",
        "the compiled fold of a first schedule ignores a handoff's lead in its action time",
        "P7 replay agrees: the compiled fold decides as the reducer (actionAt from the capability)",
        one(
            "storage/scheduled.py",
            "    action_at_ms = action_at(deliver_at_ms, r.capability)\n",
            "    action_at_ms = deliver_at_ms\n",
        ),
        SCHEDULE_FOLD_TESTS,
        rust=True,
    ),
    Mutant(
        "X7",
        "the fold files no story marks for a record a compiled fold took",
        "P7 replay agrees: the compiled fold writes exactly what the reducer writes",
        one(
            FOLD,
            "                results.append((entry, effects))\n"
            "                mark_entry(story, entry, effects)\n",
            "                results.append((entry, effects))\n",
        ),
        ("tests/storage/test_scheduled_fold.py", "tests/storage/test_story_index.py"),
        rust=True,
    ),
)

CONSOLE_TESTS = ("tests/service/test_console_reads.py", "tests/console/test_console_http.py")
SESSION_TESTS = (
    "tests/adapters/http/test_console_session.py",
    "tests/console/test_console_http.py",
)
CONSOLE = (
    Mutant(
        "V1",
        "the console's story of a message id answers for any tenant",
        "P10 tenants are isolated: another tenant's timer is absent on every route",
        (
            Edit(
                "service/story.py",
                "    if isinstance(m, Message) and m.tenant != tenant:\n        return None\n",
                "",
            ),
            Edit(
                "service/story.py",
                "            if record.tenant != tenant:\n",
                "            if False:\n",
            ),
        ),
        CONSOLE_TESTS,
        quick_tests=("tests/service/test_console_reads.py",),
    ),
    Mutant(
        "V2",
        "a console form's CSRF token is accepted whatever its value",
        "P10 tenants are isolated: an action needs the credential's own session",
        one(
            "adapters/http/console/session.py",
            "        return token is not None and hmac.compare_digest(",
            "        return token is not None or hmac.compare_digest(",
        ),
        SESSION_TESTS,
        quick_tests=("tests/adapters/http/test_console_session.py",),
    ),
    Mutant(
        "V3",
        "a console cookie is read without checking its signature",
        "P10 tenants are isolated: a session is only what the server signed",
        one(
            "adapters/http/console/session.py",
            '        if not hmac.compare_digest(sig, self._sign(b"session" + payload)):\n'
            "            return None\n",
            "",
        ),
        SESSION_TESTS,
        quick_tests=("tests/adapters/http/test_console_session.py",),
    ),
    Mutant(
        "V4",
        "the console's recent deliveries and dead letters answer any tenant's messages",
        "P10 tenants are isolated: another tenant's timer is absent on every route",
        one(
            "service/inspect_store.py",
            "    if not isinstance(m, Message) or m.tenant != tenant:\n        return None\n"
            "    return m if queue is None",
            "    if not isinstance(m, Message):\n        return None\n"
            "    return m if queue is None",
        ),
        ("tests/service/test_console_reads.py", "tests/console/test_console_dead_letters.py"),
        quick_tests=("tests/service/test_console_reads.py",),
    ),
)

CATALOGUE: tuple[Mutant, ...] = (
    *TIME_RULES,
    *ADMISSION_CHECKS,
    *LIFECYCLE_ROWS,
    *RUNTIME,
    *STORAGE,
    *BATCHES,
    *GUARDS_ISSUE30_A,
    *GUARDS_ISSUE30_B,
    *PULSAR_EVIDENCE,
    *PULSAR_SENDS,
    *STORE_LOCK,
    *AT_REST,
    *TENANT_TOPICS,
    *TIMER_KEYS,
    *READINESS,
    *ONE_CODE_LIST,
    *CONSUMERS,
    *COMPILED_FOLDS,
    *CONSOLE,
)
