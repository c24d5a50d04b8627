"""The poller's copycat screen: a disguised copy is closed with a strike, strikes reach the blocklist,
an honest PR goes on to evaluation, and a maintainer's clear exempts a PR."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from evalbot.copycat.screen import CopycatScreen
from evalbot.model import FileChange, PullRequest
from evalbot.rules import default_rules_dir, load_rules
from evalbot.store import Store

ROOT = Path(__file__).resolve().parents[2]
RULES = load_rules(default_rules_dir())


def added(path: str, text: str) -> FileChange:
    lines = text.rstrip("\n").split("\n")
    patch = f"@@ -0,0 +1,{len(lines)} @@\n" + "\n".join("+" + line for line in lines)
    return FileChange(path, "added", len(lines), 0, patch)


def pr(number: int, author: str, created: str, *files: FileChange) -> PullRequest:
    return PullRequest(number, author, f"PR {number}", "", "open", False, False, f"{number:040x}", "0" * 40,
                       "main", f"b{number}", created, created, files=files)  # fmt: skip


def disguise(code: str, salt: str) -> str:
    """Rename every local identifier and re-space the code (what the seeds' line rule missed)."""
    names = {
        "logits": "scores_" + salt,
        "temperature": "temp_" + salt,
        "probs": "p_" + salt,
        "top_k": "k_" + salt,
    }
    for old, new in names.items():
        code = re.sub(rf"\b{old}\b", new, code)
    return code.replace(" = ", "  =  ").replace(", ", " , ")


def test_copies_are_closed_with_strikes_until_the_author_is_blocked(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    (main / "README.md").write_text("engine\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(main)], check=True)
    subprocess.run(["git", "-C", str(main), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(main), "-c", "user.name=m", "-c", "user.email=m@x", "commit", "-qm", "main"],
                   check=True)  # fmt: skip
    sha = subprocess.run(
        ["git", "-C", str(main), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    original = (ROOT / "engine" / "sampling.py").read_text()  # real code, not on this PR's main
    with Store(tmp_path / "state.db") as store:
        screen = CopycatScreen(store, RULES, main)
        screen.set_main(sha)
        first = screen(pr(1, "alice", "2026-11-01T10:00:00Z", added("engine/sampler.py", original)))
        assert first is not None and first.evaluate and first.labels == ()  # nothing earlier to copy
        honest = screen(pr(2, "bob", "2026-11-02T10:00:00Z", added("engine/cache.py",
                        (ROOT / "engine" / "kv_cache.py").read_text())))  # fmt: skip
        assert honest is not None and honest.evaluate
        for n in (3, 4, 5):
            copy = pr(
                n, "eve", f"2026-11-0{n}T10:00:00Z", added(f"engine/fast_{n}.py", disguise(original, str(n)))
            )
            got = screen(copy)
            assert got is not None and not got.evaluate and got.close and got.labels == ("copycat",), got
            assert got.notice is not None and "#1" in got.notice.lines[0] and got.flag == "copycat"
        assert [s.pr for s in store.moderation.strikes("eve")] == [3, 4, 5]
        assert "eve" in {e.login for e in store.moderation.blocklist()}  # strikes.limit (3) reached
        store.moderation.add_clear(
            6, "maint", "eve's own earlier work, checked by hand"
        )  # no head: clears nothing
        again = pr(6, "eve", "2026-11-09T10:00:00Z", added("engine/again.py", disguise(original, "z")))
        assert not screen(again).evaluate
        store.moderation.add_clear(
            6, "maint", "eve's own earlier work, checked by hand", head_sha=again.head_sha
        )
        cleared = screen(again)
        assert cleared is not None and cleared.evaluate  # a maintainer's clear of this head exempts it
        # ... and it keeps its copycat-cleared label (the screen's labels are the copycat flags alone)
        assert "copycat-cleared" not in cleared.owned
        # another author's PR, cleared at its first head; a later push that still copies is flagged again,
        # and the clearance of the earlier head comes off: a PR never shows copycat-cleared beside copycat
        first_head = pr(8, "zed", "2026-11-10T10:00:00Z", added("engine/zed.py", disguise(original, "q")))
        store.moderation.add_clear(8, "maint", "checked by hand", head_sha=first_head.head_sha)
        assert screen(first_head).evaluate
        pushed = PullRequest(**{**first_head.__dict__, "head_sha": "e" * 40})
        flagged = screen(pushed)
        assert flagged is not None and not flagged.evaluate and flagged.labels == ("copycat",)
        assert "copycat-cleared" in flagged.owned and "copycat-cleared" not in flagged.labels
