"""One poller per store, held in the store itself: a lease row (owner, heartbeat, expiry) on the file.

What a careless operator does: starts a second bot on the same state, through a symlink or `./state.db`
beside `/abs/state.db`. Before the lease, the lock file beside the state was named after the path as typed,
so the second bot started, its first poll took over the first bot's live claim (the PR was evaluated twice)
and both posted a verdict comment. These tests run both scenarios on the real store and the real bot.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from evalbot import times
from evalbot.github import PyGithubAdapter
from evalbot.mirror import Mirror
from evalbot.poller import Bot, BotSettings
from evalbot.render import MARKER
from evalbot.store import LeaseHeldError, LeaseKeeper, LeaseLostError, Store, owner_gone, worker_id
from tests.evalbot.test_bot_restart import BODY, BOT, fake_evaluator
from tests.evalbot.test_bot_restart import rules as rules
from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.serve import serve

ROOT = Path(__file__).resolve().parents[2]


def aliases(tmp_path: Path) -> tuple[Path, Path, Path]:
    """One store file by three names: absolute, through a symlinked folder, and relative with ./"""
    real = tmp_path / "state" / "state.db"
    real.parent.mkdir()
    (tmp_path / "link").symlink_to(real.parent)
    return (
        real,
        tmp_path / "link" / "state.db",
        Path(os.path.relpath(real.parent, Path.cwd())) / "." / "state.db",
    )


def test_a_second_owner_is_refused_by_any_name_of_the_file(tmp_path):
    real, linked, dotted = aliases(tmp_path)
    with Store(real) as a, Store(linked) as b, Store(dotted) as c:
        a.leases.acquire("host-a:1:aaaaaa", 60)
        for other in (b, c):
            with pytest.raises(
                LeaseHeldError,
                match=r"held by host-a:1:aaaaaa \(since .*heartbeat 0 s ago, "
                r"lapses in 60 s\)",
            ) as err:
                other.leases.acquire("host-b:2:bbbbbb", 60)
            assert err.value.holder.owner == "host-a:1:aaaaaa"
        assert a.leases.acquire("host-a:1:aaaaaa", 60).owner == "host-a:1:aaaaaa"  # its own: a renewal
        assert b.leases.current().owner == "host-a:1:aaaaaa"


def test_a_lapsed_lease_or_a_gone_holder_is_taken_over(tmp_path):
    with Store(tmp_path / "s.db") as store:
        t0 = times.now()
        store.leases.acquire("a", 30, now=t0)
        with pytest.raises(LeaseHeldError):
            store.leases.acquire("b", 30, now=t0 + timedelta(seconds=29))
        assert store.leases.acquire("b", 30, now=t0 + timedelta(seconds=31)).owner == "b"
        assert store.leases.acquire("c", 30, gone=lambda owner: owner == "b").owner == "c"
        assert not store.leases.release("b") and store.leases.release("c") and store.leases.current() is None


def test_the_heartbeat_keeps_the_lease_past_its_ttl_and_stop_releases_it(tmp_path):
    path = tmp_path / "s.db"
    with Store(path) as a, Store(path) as b:
        keeper = LeaseKeeper(a.leases, "a", 2.0)  # a beat every 0.5 s: a loaded box may delay one, not four
        keeper.start()
        time.sleep(5.0)  # 2.5 ttls: only the heartbeat keeps it
        with pytest.raises(LeaseHeldError):
            b.leases.acquire("b", 2.0)
        keeper.check()
        keeper.stop()
        assert b.leases.current() is None and b.leases.acquire("b", 2.0).owner == "b"


def test_a_holder_whose_lease_was_taken_over_learns_it_and_stops(tmp_path):
    path = tmp_path / "s.db"
    with Store(path) as a, Store(path) as b:
        keeper = LeaseKeeper(a.leases, "a", 0.8)
        keeper.start()
        b.leases.acquire("b", 60, gone=lambda owner: True)  # as after a long suspension of "a"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                keeper.check()
            except LeaseLostError as exc:
                assert "taken over" in str(exc)
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the keeper never noticed that its lease was taken over")
        keeper.stop()
        assert b.leases.current().owner == "b"  # stop() never releases a lease that is no longer its own


def test_owner_gone_only_for_a_dead_process_of_this_host():
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    me = worker_id()
    host = me.split(":")[0]
    assert owner_gone(f"{host}:{dead.stdout.strip()}:abcdef")
    assert not owner_gone(me) and not owner_gone(f"{host}:1:abcdef")  # alive (or not ours to signal)
    assert not owner_gone(f"elsewhere:{dead.stdout.strip()}:abcdef") and not owner_gone("local")


def test_the_cli_refuses_a_second_poller_naming_the_holder_before_any_poll(tmp_path):
    real, linked, _ = aliases(tmp_path)
    env = {**os.environ, "GITHUB_TOKEN": "ghp_x", "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [
        sys.executable,
        "-m",
        "evalbot",
        "poll",
        "--once",
        "--repo",
        "o/r",
        "--api-url",
        "http://127.0.0.1:9",
        "--bot-login",
        "evalbot",
        "--state",
        str(linked),
    ]  # the login given: no request before the lease
    with Store(real) as store:
        store.leases.acquire(worker_id(), 60)  # this (live) process holds it
        t0 = time.monotonic()
        proc = subprocess.run(
            [*argv, "--wait", "2"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
        )
        waited = time.monotonic() - t0
        assert proc.returncode != 0 and "held by" in proc.stderr and str(os.getpid()) in proc.stderr, (
            proc.stderr
        )
        assert "waiting for the store's poller lease" in proc.stderr and waited >= 2
        assert "GitHub" not in proc.stderr  # refused before any request (the API's address is unreachable)
        # a holder that died on this host: taken over at once (the poll then fails on the unreachable API)
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        ).stdout.strip()
        store.leases.acquire(f"{worker_id().split(':')[0]}:{dead}:dead00", 60, gone=lambda _o: True)
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert "held by" not in proc.stderr, proc.stderr
        assert store.leases.current() is None  # taken, then given up when the poll ended


@pytest.mark.parametrize(
    "workers", [("host-a:1:aaaaaa", "host-b:2:bbbbbb"), (None, None)], ids=["named", "library-defaults"]
)
def test_two_bots_on_one_store_never_evaluate_or_comment_twice(tmp_path, rules, workers):
    """The first bot is measuring PR #1 when a second one starts on the same file through a symlink: the
    second refuses (its first poll would have taken over the live claim and measured #1 again), and once the
    first has stopped it takes over without repeating anything: one evaluation and one comment per PR.
    With the library's default settings too (no worker named): two bots built that way once shared the name
    `local`, so the second took the first's lease for its own, measured #1 again and posted a second verdict."""
    real, linked, _ = aliases(tmp_path)
    evaluated: list[tuple[str, int]] = []
    refused: list[str] = []
    made = itertools.count()
    with serve() as double:
        st = double.state
        repo = BareRepo.create(
            tmp_path / "remote.git", {"engine/model.py": "x = 0\n", "README.md": "r\n"}, when=st.now
        )
        st.clone_url = repo.url
        for n, login in ((1, "alice"), (2, "bob")):
            add_git_pull(st, repo, n, {f"engine/part{n}.py": f"y = {n}\n"}, author_login=login, body=BODY)

        def make_bot(path: Path, worker: str | None, evaluate) -> tuple[Bot, Store]:
            gh = PyGithubAdapter.from_token(double.repo, "ghp_t", base_url=double.base_url, pace=False, timeout=5.0,
                                            rng=random.Random(0))  # fmt: skip
            store = Store(path)
            settings = (
                BotSettings(bot_login=BOT) if worker is None else BotSettings(bot_login=BOT, worker=worker)
            )
            return Bot(gh, store, rules, settings, Mirror(repo.url, tmp_path / f"mirror-{next(made)}.git"),
                       evaluate, lambda _: None), store  # fmt: skip

        honest = fake_evaluator(rules)

        def first_evaluates(req, *a):
            evaluated.append(("first", req.pr))
            if req.pr == 1:  # mid-measurement: a careless operator starts a second bot
                second, store2 = make_bot(linked, workers[1], second_evaluates)
                requests = len(st.requests)
                with pytest.raises(LeaseHeldError) as err:
                    second.poll_once()
                refused.append(str(err.value))
                assert len(st.requests) == requests  # it asked GitHub nothing
                claimed = store2.queue.evaluations(pr=1, state="claimed")
                assert [r.claimed_by for r in claimed] == [
                    first.settings.worker
                ]  # the live claim stays the first's
                store2.close()
            return honest(req, *a)

        def second_evaluates(req, *a):
            evaluated.append(("second", req.pr))
            return honest(req, *a)

        first, store1 = make_bot(real, workers[0], first_evaluates)
        first.poll_once()
        assert refused and f"held by {first.settings.worker} " in refused[0]
        first.close()  # a clean stop gives the lease up
        store1.close()
        second, store2 = make_bot(linked, workers[1], second_evaluates)
        second.poll_once()
        second.close()
        store2.close()
    assert sorted(evaluated) == [("first", 1), ("first", 2)]
    for n in (1, 2):
        assert len([c for c in st.comments_on(n) if c.author == BOT and MARKER in c.body]) == 1
