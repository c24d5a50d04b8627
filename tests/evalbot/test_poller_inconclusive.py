"""An INCONCLUSIVE evaluation is infra-class: the bot measures the PR again (a bounded number of times),
never counts it against the contributor, and never merges on it."""

from __future__ import annotations

import random

from evalbot.github import PyGithubAdapter
from evalbot.judge import Judgement
from evalbot.mirror import Mirror
from evalbot.model import Measurements, Provenance, Status, ThroughputPairs
from evalbot.poller import Bot, BotSettings
from evalbot.rules import default_rules_dir, load_rules
from evalbot.store import DEFAULT_MAX_ATTEMPTS, Store
from evalbot.verdict.decide import decide
from tests.evalbot.test_poller_actions import BODY
from tests.github_double.gitrepo import BareRepo, add_git_pull

pytest_plugins = ["tests.github_double.fixture"]

BOT = "evalbot[bot]"
NOISY = ((10.0, 11.2), (10.4, 9.6), (9.8, 10.9), (10.9, 10.1), (10.1, 11.0), (10.6, 9.9))


def test_an_inconclusive_evaluation_is_measured_again_and_never_merged(github_double, fake_clock, tmp_path):
    rules = load_rules(default_rules_dir())
    st = github_double.state
    repo = BareRepo.create(tmp_path / "remote.git", {"engine/model.py": "x = 1\n"}, when=st.now)
    st.clone_url = repo.url
    add_git_pull(st, repo, 1, {"engine/model.py": "x = 2  # faster\n"}, author_login="alice", body=BODY)
    gh = PyGithubAdapter.from_token(github_double.repo, "ghp_test", base_url=github_double.base_url, pace=False,
                                    timeout=2.0, rng=random.Random(0), sleep=fake_clock.sleep,
                                    clock=fake_clock.time)  # fmt: skip
    calls: list[str] = []

    def noisy_box(req, path):
        calls.append(req.head_sha)
        prov = Provenance(
            repo=str(path),
            base_sha=req.base_sha,
            head_sha=req.head_sha,
            harness_sha=req.base_sha,
            rules_hash=req.rules_hash,
            profile=req.profile.name,
            pr=req.pr,
        )
        m = Measurements(
            prov, throughput=tuple(ThroughputPairs("m", c, "decode_tps", NOISY) for c in (128, 512))
        )
        v = decide(m, rules)
        assert v.status is Status.INCONCLUSIVE
        return Judgement(m, v, {"unsigned": True})

    with Store(tmp_path / "state.db") as store:
        settings = BotSettings(bot_login=BOT, automerge_env=True)
        bot = Bot(
            gh, store, rules, settings, Mirror(repo.url, tmp_path / "mirror.git"), noisy_box, lambda _m: None
        )
        report = bot.poll_once()
        assert len(calls) == DEFAULT_MAX_ATTEMPTS  # measured again, within the attempt limit
        assert sum("queued again" in n for n in report.notes) == DEFAULT_MAX_ATTEMPTS - 1
        [rec] = store.queue.evaluations(pr=1)
        assert rec.state == "done" and rec.verdict.status is Status.INCONCLUSIVE
        assert report.merged == [] and not st.pulls[1].merged
        labels = set(gh.get_pull(1).labels)
        assert rules.labels.inconclusive in labels and rules.labels.verified not in labels
        assert not any(t.label in labels for t in rules.tiers)
        body = next(c.body for c in st.comments_on(1) if c.author == BOT)
        assert "INCONCLUSIVE" in body and "measured again" in body
        assert bot.poll_once().evaluated == []  # the limit holds across polls too
        assert len(calls) == DEFAULT_MAX_ATTEMPTS
