"""A verdict's labels follow the rules that made them: once the rules rename a label, the next verdict takes
the old name off the PR, where the rules' own families know only today's names and left it there."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from evalbot.github import PyGithubAdapter
from evalbot.judge import Judgement
from evalbot.mirror import Mirror
from evalbot.model import Measurements, Provenance, Status, ThroughputPairs
from evalbot.poller import Bot, BotSettings
from evalbot.rules import default_rules_dir, load_rules
from evalbot.store import Store
from evalbot.verdict.decide import decide
from tests.evalbot.test_poller_actions import BODY
from tests.github_double.gitrepo import BareRepo, add_git_pull

pytest_plugins = ["tests.github_double.fixture"]

BOT = "evalbot[bot]"
QUIET = tuple((10.0 * (1 + 0.001 * (i % 3)), 10.5 * (1 + 0.001 * ((i + 1) % 3))) for i in range(16))  # +5%


def test_a_label_the_rules_renamed_comes_off_at_the_next_verdict(github_double, fake_clock, tmp_path: Path):
    st = github_double.state
    repo = BareRepo.create(tmp_path / "remote.git", {"engine/model.py": "x = 1\n"}, when=st.now)
    st.clone_url = repo.url
    add_git_pull(st, repo, 1, {"engine/model.py": "x = 2  # faster\n"}, author_login="alice", body=BODY)
    st.pulls[1].labels.append("documentation")  # a maintainer's own label: no verdict touches it
    gh = PyGithubAdapter.from_token(github_double.repo, "ghp_test", base_url=github_double.base_url, pace=False,
                                    timeout=2.0, rng=random.Random(0), sleep=fake_clock.sleep,
                                    clock=fake_clock.time)  # fmt: skip

    def box_for(rules):
        def box(req, path):
            prov = Provenance(repo=str(path), base_sha=req.base_sha, head_sha=req.head_sha, harness_sha=req.base_sha,
                              rules_hash=req.rules_hash, profile=req.profile.name, pr=req.pr)  # fmt: skip
            m = Measurements(
                prov, throughput=tuple(ThroughputPairs("m", c, "decode_tps", QUIET) for c in (128, 512))
            )
            v = decide(m, rules)
            assert v.status is Status.PASS and v.tier is not None
            return Judgement(m, v, {"unsigned": True})

        return box

    before = load_rules(default_rules_dir())
    renamed_dir = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), renamed_dir)
    labels = renamed_dir / "labels.yaml"
    labels.write_text(labels.read_text().replace(": perf:", ": speed:"))
    after = load_rules(renamed_dir)
    with Store(tmp_path / "state.db") as store:
        settings = BotSettings(bot_login=BOT, automerge_env=False)
        mirror = Mirror(repo.url, tmp_path / "mirror.git")
        Bot(gh, store, before, settings, mirror, box_for(before), lambda _m: None).poll_once()
        first = set(gh.get_pull(1).labels)
        tier = next(t.name for t in before.tiers if t.label in first)
        assert {f"perf:{tier}", before.labels.verified, "documentation"} <= first

        Bot(
            gh, store, after, settings, mirror, box_for(after), lambda _m: None
        ).poll_once()  # the rules changed
        now = set(gh.get_pull(1).labels)
        assert f"speed:{tier}" in now and f"perf:{tier}" not in now  # the old name came off
        assert {after.labels.verified, "documentation"} <= now
        assert len(store.queue.evaluations(pr=1)) == 2  # measured again under the new rules


def test_an_old_verdict_label_the_rules_now_give_another_family_is_left_to_it():
    """A label an earlier verdict added that today's rules name as a hold (a maintainer's) or a screen's flag
    is theirs now: the verdict does not take it off."""
    from types import SimpleNamespace

    from evalbot.verdict.comment import stale_labels

    rules = load_rules(default_rules_dir())
    old = SimpleNamespace(
        verdict=SimpleNamespace(labels_add=("perf-small:XS", rules.labels.hold, rules.labels.copycat))
    )
    none = SimpleNamespace(verdict=None)  # an evaluation not judged yet
    assert stale_labels([old, none], rules) == {"perf-small:XS"}
