"""evalbot.store: round trips, idempotent actions, leased claims, crash safety under SIGKILL, WAL readers,
and refusal to touch a corrupt, foreign or newer store."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from evalbot.model import (
    ContextEstimate,
    Gate,
    Measurements,
    Provenance,
    Status,
    ThroughputPairs,
    Verdict,
)
from evalbot.store import (
    SCHEMA_VERSION,
    ActionPendingError,
    Calibration,
    CorruptStoreError,
    EvalKey,
    SchemaError,
    Store,
    StoreBusyError,
    StoreError,
    action_key,
    iso,
)
from evalbot.store.db import _MIGRATIONS

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
HEAD, BASE, RULES = "a" * 40, "b" * 40, "c" * 64


def key(pr: int = 7, head: str = HEAD) -> EvalKey:
    return EvalKey(pr, head, BASE, RULES)


def verdict(status: Status = Status.PASS, low: float = 1.031) -> Verdict:
    est = ContextEstimate(
        model="qwen2.5-coder-0.5b",
        context=512,
        metric="decode_tps",
        n=8,
        base_median=40.0,
        head_median=42.0,
        ratio=1.05,
        ci_low=low,
        ci_high=1.07,
        mde=0.012,
        tier="XS",
        regression=False,
        guarded=True,
        scored=True,
    )
    return Verdict(
        status=status,
        tier="XS",
        scored_context=512,
        gates=(
            Gate("no regression", 1.07, "CI upper bound >= 0.98x main", True, "", 512, "qwen2.5-coder-0.5b"),
        ),
        reasons=("XS: +5.0% at ctx 512",),
        labels_add=("verified", "perf:XS"),
        estimates=(est,),
        rules_hash=RULES,
        mde=0.012,
    )


def measurements() -> Measurements:
    prov = Provenance(
        repo="o/r",
        base_sha=BASE,
        head_sha=HEAD,
        harness_sha=BASE,
        rules_hash=RULES,
        profile="cpu",
        model_sha256s={"qwen2.5-coder-0.5b": "d" * 64},
        box={"cpu": "x86"},
        pr=7,
    )
    tp = ThroughputPairs("qwen2.5-coder-0.5b", 512, "decode_tps", ((40.0, 42.0), (40.5, 42.1)))
    return Measurements(provenance=prov, throughput=(tp,), reproduce="evalbot evaluate ...")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def store(db: Path):
    with Store(db) as s:
        yield s


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- opening


def test_new_store_is_wal_full_sync_and_versioned(store, db):
    assert int(store.meta("schema_version")) == SCHEMA_VERSION
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # WAL is a property of the file
    conn.close()
    assert store.db._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store.db._conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0


def test_meta_round_trip_and_schema_version_is_protected(store, db):
    store.set_meta("owner", "evalbot-operator")
    with pytest.raises(ValueError, match="managed by the store's migrations"):
        store.set_meta("schema_version", "99")
    store.close()
    with Store(db) as again:
        assert again.meta("owner") == "evalbot-operator" and again.meta("nothing") is None


def test_newer_schema_is_refused_and_left_untouched(db):
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = sha(db)
    with pytest.raises(SchemaError, match=rf"schema version {SCHEMA_VERSION + 1} is newer .*upgrade evalbot"):
        Store(db)
    assert sha(db) == before


def test_foreign_sqlite_database_is_refused(db):
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE photos (id INTEGER, path TEXT)")
    conn.execute("INSERT INTO photos VALUES (1, 'a.jpg')")
    conn.commit()
    conn.close()
    before = sha(db)
    with pytest.raises(SchemaError, match=r"not an evalbot store .*photos"):
        Store(db)
    assert sha(db) == before


@pytest.mark.parametrize(
    "content, message",
    [
        (b"version: 1\nevaluations: []\n", r"not a SQLite database \(it starts with b'version"),
        (
            b"SQLite format 3\x00" + bytes(range(256)) * 20,
            "not a usable SQLite database|integrity check failed|the state file is truncated",
        ),
    ],
    ids=["text-file", "sqlite-header-then-garbage"],
)
def test_non_sqlite_file_is_refused_and_never_overwritten(db, content, message):
    db.write_bytes(content)
    with pytest.raises(CorruptStoreError, match=message) as info:
        Store(db)
    assert str(db) in str(info.value) and db.read_bytes() == content


def test_damaged_pages_are_refused_and_left_untouched(db):
    Store(db).close()
    conn = sqlite3.connect(db)
    with conn:  # one transaction: enough rows for several pages, without an fsync per row
        conn.executemany(
            "INSERT INTO clears (pr, by, reason, at) VALUES (?, 'm', ?, 'now')",
            [(i, "r" * 100) for i in range(1, 400)],
        )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 4 * page
    rng = random.Random(1)
    data[2 * page : 4 * page] = bytes(rng.randrange(256) for _ in range(2 * page))  # pages 3 and 4
    db.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="untouched"):
        Store(db)
    assert db.read_bytes() == bytes(data)


def test_missing_folder_and_directory_are_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "nowhere" / "state.db")
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def test_the_copycat_and_dispatch_parts_write_whole_or_not_at_all(store, db):
    """The parts that once ran their own SQL on a second connection now write through the store's one
    transaction helper: a failure halfway through a write leaves what was there before."""
    from evalbot.store import CopycatPr, DispatchRow

    pr = CopycatPr(7, "alice", "2026-11-30T10:00:00.000000Z", None, None)
    store.copycat.add(pr, [1, 2], [10])

    def broken():
        yield 3
        raise RuntimeError("the disk filled up")

    with pytest.raises(RuntimeError):
        store.copycat.add(pr, broken(), [11])  # a new push of #7, cut short
    assert store.copycat.postings([1, 2, 3]) == [(1, 7), (2, 7)]
    assert store.copycat.lines_shared([10, 11], 7) == 1
    row = DispatchRow(
        "r1",
        7,
        HEAD,
        BASE,
        RULES,
        "cpu",
        1,
        ("box-a",),
        workflow="eval.yml",
        ref="main",
        dispatched_at=T0,
        deadline=T0,
    )
    store.dispatches.save(row)
    with pytest.raises(ValueError, match="close\\(\\) state"):
        store.dispatches.close(row)  # still "dispatching"
    store.dispatches.close(replace(row, state="failed", note="gave up", run_id=5))
    store.close()
    with Store(db) as again:
        assert again.copycat.prs([7]) == {7: pr}
        (kept,) = again.dispatches.history(7, HEAD, BASE, RULES)
        assert (kept.state, kept.run_id, kept.exclude_runners, kept.dispatched_at) == (
            "failed",
            5,
            ("box-a",),
            T0,
        )
        assert again.dispatches.open() == []


def test_a_store_in_memory_has_every_table_and_one_connection():
    with Store.in_memory() as store:
        assert int(store.meta("schema_version")) == SCHEMA_VERSION
        store.copycat.set_main([1, 2], "2026-11-30T10:00:00.000000Z")
        assert store.copycat.in_main([1, 3], "2026-11-30T11:00:00.000000Z") == {1}
        with pytest.raises(StoreError, match="in memory has one connection"):
            store.db.open_connection()


# ---------------------------------------------------------------- evaluations


def test_evaluation_round_trip_survives_reopen(store, db):
    k = key()
    assert store.queue.enqueue_evaluation(k, now=T0) is True
    assert store.queue.enqueue_evaluation(k, now=T0) is False  # already known: nothing changes
    rec = store.queue.claim_next("w1", now=T0 + timedelta(seconds=5))
    assert (rec.key, rec.state, rec.attempts, rec.claimed_by) == (k, "claimed", 1, "w1")
    assert rec.started_at == iso(T0 + timedelta(seconds=5)) and rec.verdict is None
    receipt = {"schema": 1, "signature": "AAAA", "body": {"verdict": "PASS"}}
    store.queue.finish_evaluation(k, "w1", verdict(), measurements(), receipt, now=T0 + timedelta(minutes=20))
    store.close()

    with Store(db) as again:
        done = again.queue.evaluation(k)
        assert done.state == "done" and done.status is Status.PASS
        assert done.verdict == verdict() and done.measurements == measurements() and done.receipt == receipt
        assert (done.queued_at, done.finished_at) == (iso(T0), iso(T0 + timedelta(minutes=20)))
        assert done.claimed_by is None and done.lease_until is None
        assert [r.key for r in again.queue.evaluations(pr=7, state="done")] == [k]
        assert again.queue.evaluations(state="queued") == []
        assert again.queue.claim_next("w2") is None


def test_a_verdict_stored_with_the_retired_labels_remove_still_reads(store, db):
    """Bots before #37 stored each verdict with a labels_remove field: such a row reads back, that field
    ignored; any other unknown field is still a corrupt row."""
    k = key()
    store.queue.enqueue_evaluation(k, now=T0)
    store.queue.claim_next("w1", now=T0)
    store.queue.finish_evaluation(k, "w1", verdict(), measurements(), now=T0 + timedelta(minutes=20))
    store.close()
    conn = sqlite3.connect(db)
    stored = json.loads(conn.execute("SELECT verdict FROM evaluations").fetchone()[0])
    with conn:
        conn.execute(
            "UPDATE evaluations SET verdict = ?", (json.dumps(stored | {"labels_remove": ["regression"]}),)
        )
    with Store(db) as again:
        assert again.queue.evaluation(k).verdict == verdict()
    with conn:
        conn.execute("UPDATE evaluations SET verdict = ?", (json.dumps(stored | {"labels_removed": []}),))
    conn.close()
    with Store(db) as again, pytest.raises(CorruptStoreError, match="labels_removed"):
        again.queue.evaluation(k)


def test_evaluation_keys_differ_by_every_part(store):
    keys = [
        key(),
        key(8),
        key(head="e" * 40),
        EvalKey(7, HEAD, "f" * 40, RULES),
        EvalKey(7, HEAD, BASE, "9" * 64),
    ]
    assert all(store.queue.enqueue_evaluation(k, now=T0) for k in keys)
    assert len(store.queue.evaluations()) == 5


def test_claims_are_exclusive_and_finishing_needs_the_claim(store):
    store.queue.enqueue_evaluation(key(1), now=T0)
    store.queue.enqueue_evaluation(key(2), now=T0 + timedelta(seconds=1))
    a = store.queue.claim_next("w1", now=T0)
    b = store.queue.claim_next("w2", now=T0)
    assert (a.key.pr, b.key.pr) == (1, 2)  # oldest first, and never the same one twice
    assert store.queue.claim_next("w3", now=T0) is None
    with pytest.raises(StoreError, match="not claimed by 'w1' \\(it is claimed by 'w2'\\)"):
        store.queue.finish_evaluation(b.key, "w1", verdict())
    store.queue.finish_evaluation(b.key, "w2", verdict(Status.REJECT))
    with pytest.raises(StoreError, match="it is done"):
        store.queue.finish_evaluation(b.key, "w2", verdict())  # a finished verdict is never overwritten
    assert store.queue.evaluation(b.key).status is Status.REJECT
    with pytest.raises(StoreError, match="is not in the store"):
        store.queue.finish_evaluation(key(99), "w1", verdict())


def test_a_crashed_claim_is_retried_after_its_lease_then_given_up(store):
    store.queue.enqueue_evaluation(key(), now=T0)
    first = store.queue.claim_next("w1", now=T0, lease_s=60)
    assert first.attempts == 1
    assert (
        store.queue.claim_next("w2", now=T0 + timedelta(seconds=59), lease_s=60) is None
    )  # lease still held
    second = store.queue.claim_next("w2", now=T0 + timedelta(seconds=61), lease_s=60, max_attempts=2)
    assert (second.claimed_by, second.attempts) == ("w2", 2)
    # w1 woke up late: its claim is gone, so it cannot overwrite w2's work.
    with pytest.raises(StoreError, match="not claimed by 'w1'"):
        store.queue.finish_evaluation(key(), "w1", verdict())
    assert store.queue.claim_next("w3", now=T0 + timedelta(seconds=200), lease_s=60, max_attempts=2) is None
    gave_up = store.queue.evaluation(key())
    assert gave_up.state == "gave_up" and "gave up after 2 attempts" in gave_up.error  # kept, not lost


def test_requeue_claims_on_restart_and_release(store):
    for pr in (1, 2, 3):
        store.queue.enqueue_evaluation(key(pr), now=T0 + timedelta(seconds=pr))
    store.queue.claim_next("old-run", now=T0)
    store.queue.claim_next("new-run", now=T0)
    assert store.queue.requeue_claims(except_worker="new-run") == [key(1)]
    assert {r.key.pr: r.state for r in store.queue.evaluations()} == {1: "queued", 2: "claimed", 3: "queued"}
    store.queue.release_evaluation(key(2), "new-run", error="box went away")
    rec = store.queue.evaluation(key(2))
    assert (rec.state, rec.error, rec.attempts) == ("queued", "box went away", 1)
    with pytest.raises(StoreError, match="not claimed"):
        store.queue.release_evaluation(key(2), "new-run")


def test_bad_evaluation_input_is_refused_before_writing(store):
    with pytest.raises(ValueError, match="pr: expected a positive integer, got 0"):
        store.queue.enqueue_evaluation(EvalKey(0, HEAD, BASE, RULES))
    with pytest.raises(ValueError, match="head_sha: expected non-empty text"):
        store.queue.enqueue_evaluation(EvalKey(1, "", BASE, RULES))
    with pytest.raises(ValueError, match="state: expected one of"):
        store.queue.evaluations(state="running")
    with pytest.raises(ValueError, match="timezone-aware"):
        store.queue.enqueue_evaluation(key(), now=datetime(2026, 1, 1))
    store.queue.enqueue_evaluation(key(), now=T0)
    store.queue.claim_next("w", now=T0)
    bad = Measurements(provenance=measurements().provenance, reproduce=float("nan"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="measurements is not JSON data"):
        store.queue.finish_evaluation(key(), "w", verdict(), bad)
    assert store.queue.evaluation(key()).state == "claimed"  # nothing was half-written


# ---------------------------------------------------------------- actions


def test_action_key_digests_the_intent():
    a = action_key("comment", 7, HEAD, {"body": "x", "marker": "m"})
    assert a.startswith(f"comment:7:{HEAD}:") and len(a.rsplit(":", 1)[1]) == 16
    assert a == action_key("comment", 7, HEAD, {"marker": "m", "body": "x"})  # key order does not matter
    assert a != action_key("comment", 7, HEAD, {"body": "y", "marker": "m"})
    assert a != action_key("labels", 7, HEAD, {"body": "x", "marker": "m"})
    assert action_key("strike", None, HEAD, ["x"]).startswith("strike:-:")
    with pytest.raises(ValueError, match="action kind"):
        action_key("Comment!", 7, HEAD, {})


def test_actions_are_idempotent(store, db):
    k = action_key("merge", 7, HEAD, {"sha": HEAD})
    assert store.actions.action(k) is None
    assert store.actions.begin_action(k, {"sha": HEAD}, now=T0) is True
    assert [a.key for a in store.actions.pending_actions()] == [k]
    store.actions.finish_action(k, {"merged": True, "sha": HEAD}, now=T0)
    store.actions.finish_action(k, {"merged": True, "sha": HEAD})  # a second completion changes nothing
    assert store.actions.begin_action(k, {"sha": HEAD}) is False
    store.close()
    with Store(db) as again:
        assert again.actions.begin_action(k, {"sha": HEAD}) is False  # and after a restart
        rec = again.actions.action(k)
        assert (rec.kind, rec.pr, rec.state, rec.attempts, rec.result) == (
            "merge",
            7,
            "done",
            1,
            {"merged": True, "sha": HEAD},
        )
        assert again.actions.pending_actions() == []


def test_unreconciled_intent_is_never_redone_blindly(store):
    k = action_key("comment", 7, HEAD, {"marker": "<!-- evalbot:result -->"})
    store.actions.begin_action(k, {"marker": "<!-- evalbot:result -->"}, now=T0)
    # the process died here: did the comment reach GitHub?
    with pytest.raises(ActionPendingError, match="outcome is unknown: check GitHub"):
        store.actions.begin_action(k, {"marker": "<!-- evalbot:result -->"})
    (pending,) = store.actions.pending_actions(kind="comment", pr=7)
    assert pending.payload == {"marker": "<!-- evalbot:result -->"} and pending.begun_at == iso(T0)
    # GitHub has no comment with the marker: cancel, then the action may start again.
    store.actions.cancel_action(k, "no comment with the marker on the PR")
    assert store.actions.pending_actions() == [] and store.actions.action(k).state == "cancelled"
    with pytest.raises(StoreError, match="was cancelled"):
        store.actions.finish_action(k, {})
    assert store.actions.begin_action(k, {"marker": "<!-- evalbot:result -->"}) is True
    assert store.actions.action(k).attempts == 2
    store.actions.finish_action(k, {"comment_id": 123})
    assert store.actions.action(k).state == "done"


def test_reconciled_intent_is_finished_without_acting_again(store):
    k = action_key("labels", 7, HEAD, {"add": ["verified"]})
    store.actions.begin_action(k, {"add": ["verified"]})
    # GitHub already shows the label: record the completion found there.
    store.actions.finish_action(k, {"reconciled": True})
    assert store.actions.begin_action(k, {"add": ["verified"]}) is False


def test_action_errors_are_specific(store):
    with pytest.raises(StoreError, match="no recorded intent"):
        store.actions.finish_action(action_key("close", 7, HEAD, {}), {})
    with pytest.raises(StoreError, match="not a pending intent"):
        store.actions.cancel_action(action_key("close", 7, HEAD, {}), "why")
    with pytest.raises(ValueError, match="expected 'kind:pr:head_sha:digest'"):
        store.actions.begin_action("just-a-name", {})
    with pytest.raises(ValueError, match="action payload is not JSON data"):
        store.actions.begin_action(action_key("close", 7, HEAD, {}), {"when": object()})
    assert store.actions.pending_actions() == []


# ---------------------------------------------------------------- the rest of the state


def test_strikes_and_blocklist(store, db):
    assert store.moderation.add_strike("Mallory", 7, "copycat of #3", now=T0) is True
    assert (
        store.moderation.add_strike("mallory", 7, "copycat of #3", now=T0) is False
    )  # logins are case-insensitive
    assert store.moderation.add_strike("mallory", 9, "copycat of #3", now=T0 + timedelta(days=40))
    assert [s.pr for s in store.moderation.strikes("MALLORY")] == [7, 9]
    assert [s.pr for s in store.moderation.strikes("mallory", since=T0 + timedelta(days=1))] == [9]
    assert store.moderation.strikes("alice") == []

    assert store.moderation.block("Spammer", "gaming the benchmark", "maintainer1", now=T0)
    assert not store.moderation.block("spammer", "again", "maintainer2")
    assert store.moderation.unblock("spammer", "appeal accepted", "maintainer1", now=T0 + timedelta(days=1))
    assert not store.moderation.unblock("spammer", "again", "maintainer1")
    assert store.moderation.block("spammer", "relapse", "maintainer2", now=T0 + timedelta(days=2))
    store.close()
    with Store(db) as again:
        (entry,) = again.moderation.blocklist()
        assert (entry.login, entry.reason, entry.by) == ("spammer", "relapse", "maintainer2")
        assert [e.event for e in again.moderation.blocklist_history("SPAMMER")] == [
            "block",
            "unblock",
            "block",
        ]


def test_rounds_ledger_holds_clears(store, db):
    assert store.rounds.open_round("r1", BASE, now=T0) and not store.rounds.open_round("r1", BASE)
    store.rounds.set_round_member("r1", 12, "1" * 40, 0.031)
    store.rounds.set_round_member("r1", 10, "2" * 40, 0.02)
    store.rounds.set_round_member("r1", 12, "3" * 40, 0.035)  # re-evaluated: updated, not duplicated
    with pytest.raises(StoreError, match="PR 11 is not a member"):
        store.rounds.close_round("r1", 11)
    with pytest.raises(ValueError, match="lower_bound_gain: expected a finite number"):
        store.rounds.set_round_member("r1", 13, "4" * 40, float("inf"))
    assert store.rounds.round("r1").closed_at is None
    store.rounds.close_round("r1", 12, now=T0 + timedelta(hours=1))
    with pytest.raises(StoreError, match="closed at"):
        store.rounds.set_round_member("r1", 14, "5" * 40, 0.1)
    with pytest.raises(StoreError, match="does not exist"):
        store.rounds.set_round_member("r2", 14, "5" * 40, 0.1)

    assert store.rounds.record_ledger("merge", 12, "3" * 40, "alice", 0.035, 0.035, now=T0)
    assert not store.rounds.record_ledger("merge", 12, "3" * 40, "alice", 0.035, 0.035)
    assert store.rounds.record_ledger("credit", 10, "6" * 40, "bob", 0.02, 0.004, now=T0)
    with pytest.raises(ValueError, match="ledger kind"):
        store.rounds.record_ledger("bonus", 10, "6" * 40, "bob", 0.02, 0.004)

    assert store.moderation.hold(10, "maintainer1", "waiting for the design review", now=T0)
    assert not store.moderation.hold(10, "maintainer2", "again")
    assert store.moderation.release_hold(10, "maintainer1") and not store.moderation.release_hold(
        10, "maintainer1"
    )
    assert store.moderation.hold(10, "maintainer2", "second look")
    with pytest.raises(ValueError, match="reason: expected non-empty text"):
        store.moderation.add_clear(10, "maintainer1", "  ")
    store.moderation.add_clear(10, "maintainer1", "copycat warning was a false positive", now=T0)

    store.close()

    with Store(db) as again:
        r1 = again.rounds.round("r1")
        assert (r1.base_sha, r1.winner, r1.closed_at) == (BASE, 12, iso(T0 + timedelta(hours=1)))
        assert [(m.pr, m.head_sha[0], m.lower_bound_gain) for m in r1.members] == [
            (10, "2", 0.02),
            (12, "3", 0.035),
        ]
        assert again.rounds.round("r1").closed_at is not None and again.rounds.round("nope") is None
        assert [(e.kind, e.pr, e.marginal_gain) for e in again.rounds.ledger()] == [
            ("merge", 12, 0.035),
            ("credit", 10, 0.004),
        ]
        assert [e.pr for e in again.rounds.ledger("BOB")] == [10]
        assert again.moderation.hold_for(10).reason == "second look" and again.moderation.hold_for(12) is None
        assert [(h.reason, h.released_by) for h in again.moderation.holds(active_only=False)] == [
            ("waiting for the design review", "maintainer1"),
            ("second look", None),
        ]
        assert [c.reason for c in again.moderation.clears(10)] == ["copycat warning was a false positive"]


def calibration(context: int = 512, at: datetime = T0, profile: str = "gpu", **kw) -> Calibration:
    fields = dict(at=iso(at), box="gpu-box-1", profile=profile, model="qwen3-8b", context=context, runs=20,
                  false_positive_rate=0.05, mde=0.0123, noise_cv=0.004,
                  details={"mde_max": 0.02, "ratios": [1.001, 0.998], "box": {"gpu": {"name": "H200"}}})  # fmt: skip
    return Calibration(**(fields | kw))


def test_calibrations_round_trip_in_order_and_by_profile(store, db):
    later = calibration(128, at=T0 + timedelta(days=1))
    assert store.calibrations.record(later)
    assert store.calibrations.record(calibration(512))
    assert store.calibrations.record(calibration(128, profile="cpu", model="qwen2.5-coder-0.5b"))
    assert not store.calibrations.record(calibration(512, runs=3))  # same (at, box, profile, model, context)
    store.close()
    with Store(db) as again:
        assert again.calibrations.recorded() == [
            calibration(512),
            calibration(128, profile="cpu", model="qwen2.5-coder-0.5b"),
            later,
        ]
        assert [c.context for c in again.calibrations.recorded("gpu")] == [512, 128]
        assert again.calibrations.recorded("nope") == []
        assert again.calibrations.recorded("gpu")[0].details["box"] == {"gpu": {"name": "H200"}}


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"runs": 0}, "runs: expected an integer >= 1"),
        ({"context": True}, "context: expected an integer"),
        ({"false_positive_rate": 1.5}, r"false_positive_rate: expected a finite number in \[0, 1.0\]"),
        ({"mde": float("nan")}, "mde: expected a finite number"),
        ({"noise_cv": -0.1}, "noise_cv: expected a finite number"),
        ({"box": " "}, "box: expected non-empty text"),
        ({"details": {"x": float("inf")}}, "calibration details is not JSON data"),
        ({"details": ["x"]}, "details: expected a dict"),
    ],
)
def test_bad_calibrations_are_refused_before_writing(store, bad, message):
    with pytest.raises(ValueError, match=message):
        store.calibrations.record(calibration(**bad))
    assert store.calibrations.recorded() == []


def test_a_version_1_store_gains_the_calibrations_table_and_keeps_its_data(db):
    conn = sqlite3.connect(db)
    with conn:
        for statement in _MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO clears (pr, by, reason, at) VALUES (3, 'm', 'kept', 'then')")
    conn.close()
    with Store(db) as store:
        assert int(store.meta("schema_version")) == SCHEMA_VERSION >= 2
        assert [c.reason for c in store.moderation.clears()] == ["kept"]
        assert store.calibrations.recorded() == []
        assert store.calibrations.record(calibration())
    with Store(db) as again:  # reopening a migrated store migrates nothing twice
        assert int(again.meta("schema_version")) == SCHEMA_VERSION and len(again.calibrations.recorded()) == 1


def test_a_version_3_store_moves_every_table_into_the_migrations_and_keeps_its_data(db):
    """Before version 4 the copycat index and dispatch handles made their own tables, and two tables
    nothing wrote (penalties, poll_state) were created: version 4 owns the first, drops the second."""
    conn = sqlite3.connect(db)
    with conn:
        for v in (1, 2, 3):
            for statement in _MIGRATIONS[v]:
                conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '3')")
        conn.execute(
            "CREATE TABLE copycat_prs (number INTEGER PRIMARY KEY, author TEXT NOT NULL, "
            "created_at TEXT NOT NULL, merged_at TEXT, closed_at TEXT)"
        )
        conn.execute("INSERT INTO copycat_prs VALUES (5, 'alice', '2026-11-30T10:00:00Z', NULL, NULL)")
        conn.execute("INSERT INTO strikes (author, pr, reason, at) VALUES ('m', 4, 'copy', ?)", (iso(T0),))
    conn.close()
    with Store(db) as store:
        assert int(store.meta("schema_version")) == SCHEMA_VERSION == 6
        tables = {r[0] for r in store.db.read("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {
            "dispatch_runs",
            "copycat_prs",
            "copycat_postings",
            "copycat_lines",
            "copycat_main",
            "leases",
        } <= tables
        assert not {"penalties", "poll_state"} & tables
        assert [s.pr for s in store.moderation.strikes("m")] == [4]
        assert store.copycat.prs([5])[5].author == "alice"


def test_times_compare_as_times_whatever_their_text(store):
    """A strike written with an offset (by an older writer, or by hand) counts from the right moment."""
    with store.db.write() as conn:  # 10:30+01:00 is 09:30Z: earlier than 10:15Z, though its text sorts later
        conn.execute(
            "INSERT INTO strikes (author, pr, reason, at) VALUES ('m', 1, 'a', '2026-11-30T10:30:00+01:00')"
        )
        conn.execute(
            "INSERT INTO strikes (author, pr, reason, at) VALUES ('m', 2, 'b', '2026-11-30T10:15:00.000000Z')"
        )
    assert [s.pr for s in store.moderation.strikes("m")] == [1, 2]
    assert [s.pr for s in store.moderation.strikes("m", since=T0)] == [2]


# ---------------------------------------------------------------- crashes and concurrency

# A bot-shaped writer: reconcile, requeue, evaluate everything queued, then publish one comment per
# finished evaluation through the two-phase protocol. "GitHub" is an append-only file of markers.
# KILL_AT="stage:pr" makes it SIGKILL itself there; "commit:pr" fires inside finish_evaluation's
# transaction, after its UPDATE and before its COMMIT.
WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from evalbot.model import Gate, GateKind, Status, Verdict
    from evalbot.store import EvalKey, Store, action_key

    db, github, n, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    def die(stage, pr):
        if kill_at == f"{stage}:{pr}":
            os.kill(os.getpid(), signal.SIGKILL)
        print(stage, pr, flush=True)  # progress, for the random killer

    def on_github():
        try:
            with open(github) as fh:
                return fh.read().split()
        except FileNotFoundError:
            return []

    def verdict(pr):
        # a fat row, so that random kills often land inside its transaction
        gates = tuple(Gate(f"gate {i}", i / 7, "bar", True, "x" * 200, kind=GateKind.SPEC) for i in range(40))
        return Verdict(Status.PASS, "XS", 512, gates, (f"pr {pr}",), ("verified",))

    store = Store(db)
    worker = f"w{os.getpid()}"
    for a in store.actions.pending_actions():
        if a.payload["marker"] in on_github():
            store.actions.finish_action(a.key, {"reconciled": True})
        else:
            store.actions.cancel_action(a.key, "marker not on GitHub")
    store.queue.requeue_claims(except_worker=worker)
    for pr in range(1, n + 1):
        store.queue.enqueue_evaluation(EvalKey(pr, f"{pr:040x}", "b" * 40, "r" * 64))
    print("ready", flush=True)

    target = f"{int(kill_at.split(':')[1]):040x}" if kill_at.startswith("commit:") else None
    armed = []  # the head sha being finished, then "fire" once its UPDATE has run
    def trace(sql):
        if target in armed and sql.startswith("UPDATE evaluations SET state = 'done'"):
            armed.append("fire")
        if sql == "COMMIT" and "fire" in armed:
            os.kill(os.getpid(), signal.SIGKILL)
    store.db._conn.set_trace_callback(trace)

    while (rec := store.queue.claim_next(worker)) is not None:
        armed[:] = [rec.key.head_sha]
        die("claimed", rec.key.pr)
        store.queue.finish_evaluation(rec.key, worker, verdict(rec.key.pr))
        die("finished", rec.key.pr)
    armed[:] = []
    for rec in store.queue.evaluations(state="done"):
        marker = f"<!--evalbot:{rec.key.pr}-->"
        k = action_key("comment", rec.key.pr, rec.key.head_sha, {"marker": marker})
        if not store.actions.begin_action(k, {"marker": marker}):
            continue
        die("intent", rec.key.pr)
        fd = os.open(github, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (marker + "\\n").encode())
        os.fsync(fd)
        os.close(fd)
        die("posted", rec.key.pr)
        store.actions.finish_action(k, {"posted": marker})
    print("complete", flush=True)
    """
)


def start_writer(tmp_path: Path, n: int, kill_at: str = "") -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    if not script.exists():
        script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [
        sys.executable,
        str(script),
        str(tmp_path / "state.db"),
        str(tmp_path / "github.log"),
        str(n),
        kill_at,
    ]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_writer(tmp_path: Path, n: int, kill_at: str = "") -> int:
    proc = start_writer(tmp_path, n, kill_at)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err
    if proc.returncode == 0:
        assert out.split()[-1] == "complete", err
    return proc.returncode


def assert_consistent(tmp_path: Path, n: int) -> None:
    """Every evaluation done once with a whole verdict; every comment on GitHub exactly once."""
    with Store(tmp_path / "state.db") as s:
        recs = s.queue.evaluations()
        assert [r.key.pr for r in recs] == list(range(1, n + 1))
        assert all(r.state == "done" and r.verdict.reasons == (f"pr {r.key.pr}",) for r in recs)
        assert all(len(r.verdict.gates) == 40 for r in recs)
        assert s.actions.pending_actions() == []
        markers = (tmp_path / "github.log").read_text().split()
        assert sorted(markers) == sorted(f"<!--evalbot:{pr}-->" for pr in range(1, n + 1))  # none twice
        assert all(
            s.actions.action(
                action_key("comment", pr, f"{pr:040x}", {"marker": f"<!--evalbot:{pr}-->"})
            ).state
            == "done"
            for pr in range(1, n + 1)
        )


@pytest.mark.parametrize("stage", ["claimed", "commit", "finished", "intent", "posted"])
def test_kill_at_each_step_loses_and_duplicates_nothing(tmp_path, stage):
    n = 6
    assert run_writer(tmp_path, n, kill_at=f"{stage}:3") == -signal.SIGKILL
    with Store(tmp_path / "state.db") as s:
        third = s.queue.evaluation(EvalKey(3, f"{3:040x}", "b" * 40, "r" * 64))
        if stage in ("claimed", "commit"):
            assert third.state == "claimed" and third.verdict is None  # the UPDATE before COMMIT is gone
        else:
            assert third.state == "done"
        if stage in ("intent", "posted"):
            assert [a.pr for a in s.actions.pending_actions()] == [3]
    assert run_writer(tmp_path, n) == 0
    assert_consistent(tmp_path, n)
    with Store(tmp_path / "state.db") as s:
        third = s.queue.evaluation(EvalKey(3, f"{3:040x}", "b" * 40, "r" * 64))
        assert third.attempts == (2 if stage in ("claimed", "commit") else 1)


def test_random_sigkills_lose_and_duplicate_nothing(tmp_path):
    # Kill after a random amount of progress; the signal lands wherever the writer has got to by then
    # (often inside a commit's fsync), and each restart must pick up from a consistent store.
    n, rng, kills, interrupted = 20, random.Random(20261130), 0, set()
    for _ in range(100):
        proc = start_writer(tmp_path, n)
        lines = [proc.stdout.readline().strip() for _ in range(rng.randint(1, 10))]
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        if "complete" in lines or "complete" in out.split("\n"):
            break
        assert proc.returncode == -signal.SIGKILL, err
        kills += 1
        with Store(tmp_path / "state.db") as s:
            if s.queue.evaluations(state="claimed"):
                interrupted.add("evaluation")
            if s.actions.pending_actions():
                interrupted.add("action")
    else:
        pytest.fail("the writer never completed")
    assert kills >= 5, kills
    assert interrupted, "no kill landed between a claim or intent and its completion"
    assert_consistent(tmp_path, n)


def test_readers_are_not_blocked_by_a_writer_in_wal(db, tmp_path):
    with Store(db) as s:
        s.queue.enqueue_evaluation(key(1), now=T0)
    # A writer in another process holds the write lock with an uncommitted row for a whole second.
    holder = textwrap.dedent(
        f"""
        import sqlite3, time
        conn = sqlite3.connect({str(db)!r}, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO strikes (author, pr, reason, at) VALUES ('x', 1, 'uncommitted', 'now')")
        print("locked", flush=True)
        time.sleep(1.0)
        conn.execute("COMMIT")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with Store(db, busy_timeout_ms=0) as reader:  # would raise "database is locked" if it had to wait
            assert [r.key for r in reader.queue.evaluations()] == [key(1)]
            assert reader.moderation.strikes() == []  # the uncommitted row is invisible
            assert time.monotonic() - started < 0.9
            with pytest.raises(StoreBusyError, match="held the store's write lock"):
                reader.moderation.add_strike("y", 2, "writers still take turns")
    finally:
        proc.wait(timeout=10)
    with Store(db) as after:
        assert [s.reason for s in after.moderation.strikes()] == ["uncommitted"]


def test_reader_sees_whole_transactions_while_another_process_writes(tmp_path):
    n = 30
    proc = start_writer(tmp_path, n)
    try:
        assert proc.stdout.readline().strip() == "ready"
        seen = 0
        with Store(tmp_path / "state.db") as reader:
            while proc.poll() is None:
                recs = reader.queue.evaluations()
                done = [r for r in recs if r.state == "done"]
                assert all(r.verdict is not None and len(r.verdict.gates) == 40 for r in done)
                assert len(done) >= seen
                seen = len(done)
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert_consistent(tmp_path, n)


def test_track_credits_are_kept_per_track_once_each_and_shown_beside_their_merge(store):
    from evalbot.dashboard.data import merges, track_tally

    sha = "3" * 40
    store.rounds.record_ledger("merge", 12, sha, "alice", 0.08, 0.08, now=T0)
    assert store.rounds.record_track_credit("decode", 12, sha, "alice", 0.08, now=T0)
    assert store.rounds.record_track_credit("spec", 12, sha, "alice", 0.31, now=T0)
    assert not store.rounds.record_track_credit("spec", 12, sha, "alice", 0.31)  # a replayed merge: once
    credits = store.rounds.track_credits()
    assert [(c.track, c.pr, c.gain) for c in credits] == [("decode", 12, 0.08), ("spec", 12, 0.31)]
    [mark] = merges(store.rounds.ledger(), credits)
    assert mark.tracks == (("decode", 0.08), ("spec", 0.31))
    assert track_tally([mark]) == [("decode", 1, ("alice",)), ("spec", 1, ("alice",))]
    with pytest.raises(ValueError, match="gain: expected a finite number"):
        store.rounds.record_track_credit("spec", 12, sha, "alice", float("nan"))
