"""Kill the bot at every step of a round and start it again: nothing lost, nothing repeated.

A round (intake, evaluations, comments, labels, statuses, a merge) is first run without a kill, counting
every write the bot makes to GitHub. Then, for every k, the round runs again from scratch and the bot dies
right after GitHub accepted its k-th write (the worst moment: the action happened, the store does not know
it yet); a fresh bot on the same store finishes the job. The GitHub state at the end must equal the
uninterrupted run's, with exactly one bot comment per PR and each merge made once. Evaluations here come from
a test double that returns measured-looking numbers at once, so that the many rounds stay fast; the real
evaluate path is covered by test_bot_scenario and test_fixture_e2e.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from evalbot.github import PyGithubAdapter
from evalbot.judge import Judgement, receipt
from evalbot.mirror import Mirror
from evalbot.model import Measurements, Provenance, ThroughputPairs
from evalbot.poller import Bot, BotSettings
from evalbot.render import MARKER
from evalbot.rules import default_rules_dir, load_rules, rules_hash
from evalbot.store import Store
from evalbot.verdict.decide import decide
from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.serve import serve

BOT = "evalbot[bot]"
BODY = """- [x] Tested: I ran the benchmark below on `main` and on this branch

| model | context | base tok/s | head tok/s | change |
|---|---|---|---|---|
| qwen2.5-coder-0.5b | 512 | 9.0 | 9.9 | +10% |
"""
GAINS = {1: 1.25, 2: 1.05, 3: 0.80}  # XL, S, a regression
WRITES = ("create_comment", "edit_comment", "add_labels", "remove_label", "close", "reopen", "merge",
          "create_status")  # fmt: skip


class Killed(BaseException):
    """The bot process dying right after GitHub accepted a request."""


@pytest.fixture(scope="module")
def rules():
    base = load_rules(default_rules_dir())
    on = replace(base, automerge=replace(base.automerge, enabled=True))
    return replace(on, rules_hash=rules_hash(on))


def fake_evaluator(rules):
    """Numbers as evaluate would return them (12 ABBA pairs per context), decided by the real verdict."""

    def evaluate(req, repo) -> Judgement:
        rng = random.Random(req.pr)
        tps = tuple(
            ThroughputPairs("qwen2.5-coder-0.5b", ctx, "decode_tps",
                            tuple((9.0 * (1 + rng.gauss(0, 0.003)), 9.0 * GAINS[req.pr] * (1 + rng.gauss(0, 0.003)))
                                  for _ in range(12)))
            for ctx in (128, 512)
        )  # fmt: skip
        prov = Provenance(str(repo), req.base_sha, req.head_sha, req.base_sha, req.rules_hash, req.profile.name,
                          measured_sha=req.measured_sha, pr=req.pr, title=req.title, author=req.author,
                          started_at="2026-11-30T10:00:00Z",
                          finished_at="2026-11-30T10:05:00Z")  # fmt: skip
        m = Measurements(prov, throughput=tps)
        v = decide(m, rules)
        return Judgement(m, v, receipt(m, v, None))

    return evaluate


def run_round(tmp_path, rules, kill_at: int | None) -> tuple[dict, int]:
    """One contest round from scratch; the bot dies after its kill_at-th GitHub write, then restarts."""
    with serve() as double:
        st = double.state
        repo = BareRepo.create(
            tmp_path / "remote.git", {"engine/model.py": "x = 0\n", "README.md": "r\n"}, when=st.now
        )
        st.clone_url = repo.url
        for n, login in ((1, "alice"), (2, "bob"), (3, "carol")):
            add_git_pull(st, repo, n, {f"engine/part{n}.py": f"y = {n}\n"}, author_login=login, body=BODY)
        add_git_pull(st, repo, 4, {"rules/gates.yaml": "x\n"}, author_login="dave", body=BODY)  # sensitive
        st.add_workflow("ci.yml")
        for n in st.pulls:  # this repository's CI passed on every head (auto-merge requires it)
            st.complete_run(
                st.start_run("ci.yml", st.pulls[n].head_ref, {}, event="pull_request").id, "success"
            )
        writes = 0
        journal: list[str] = []

        def make_bot(arm: bool, dead: str | None = None):
            gh = PyGithubAdapter.from_token(double.repo, "ghp_t", base_url=double.base_url, pace=False, timeout=5.0,
                                            rng=random.Random(0))  # fmt: skip
            for name in WRITES:
                real = getattr(gh, name)

                def counted(*a, _real=real, **kw):
                    nonlocal writes
                    out = _real(*a, **kw)
                    writes += 1
                    journal.append(f"{_real.__name__}{a}"[:300])
                    if arm and writes == kill_at:
                        raise Killed(f"after write {writes}")
                    return out

                setattr(gh, name, counted)
            store = Store(tmp_path / "state.db")
            settings = BotSettings(bot_login=BOT, automerge_env=True)
            # a restarted process takes over the lease of the one that died, as `evalbot poll` does (its
            # owner_gone finds the dead pid); here the dead one is this process's killed bot, named by its worker
            bot = Bot(gh, store, rules, settings, Mirror(repo.url, tmp_path / "mirror.git"), fake_evaluator(rules),
                      lambda _: None, owner_gone=lambda owner: owner == dead)  # fmt: skip
            return bot, store

        def until_quiet(bot: Bot) -> None:
            for _ in range(8):  # a poll that measures and merges nothing ends the round
                report = bot.poll_once()
                if not report.evaluated and not report.merged:
                    return
            raise AssertionError("the round did not settle in 8 polls")

        bot, store = make_bot(arm=kill_at is not None)
        try:
            until_quiet(bot)
        except Killed:
            store.close()
            bot, store = make_bot(arm=False, dead=bot.settings.worker)
            until_quiet(bot)

        def same_anywhere(body: str) -> str:  # the run's own folder is named in the provenance and state
            lines = [line for line in body.split("\n") if not line.startswith("<!-- evalbot:state")]
            return re.sub(r"<details><summary>Provenance.*?</details>", "", "\n".join(lines), flags=re.S)

        settled = writes
        bot.poll_once()  # nothing new on GitHub: a poll now must write nothing (no comment churn)
        idle_writes = writes - settled
        final = {
            n: (p.state, p.merged, tuple(sorted(p.labels)),
                tuple(same_anywhere(c.body) for c in st.comments_on(n) if c.author == BOT and MARKER in c.body))
            for n, p in st.pulls.items()
        }  # fmt: skip
        merges = sum(1 for r in st.requests if r.method == "PUT" and r.path.endswith("/merge"))
        store.close()
        return {"final": final, "merges": merges, "idle_writes": idle_writes,
                "idle": journal[settled:]}, writes  # fmt: skip


def test_a_kill_after_any_write_loses_nothing_and_repeats_nothing(tmp_path, rules):
    reference, total = run_round(tmp_path / "reference", rules, None)
    final = reference["final"]
    assert final[1][1] and final[2][1]  # XL merged first; S re-measured against the new main, then merged
    assert "regression" in final[3][2] and "skipped:sensitive" in final[4][2]
    assert all(len(comments) == 1 for *_, comments in final.values())
    assert reference["merges"] == 2 and total >= 10
    assert reference["idle_writes"] == 0, reference["idle"]
    assert "Not evaluated again" in final[3][3][0] and "REJECT" in final[3][3][0]  # exhausted: verdict kept
    for k in range(1, total + 1):
        got, _ = run_round(tmp_path / f"kill-{k}", rules, k)
        assert got["merges"] == 2, f"killed after write {k}: {got['merges']} merges"
        for n, want in final.items():
            assert got["final"][n] == want, f"killed after write {k}: PR #{n} ended as {got['final'][n]}"
