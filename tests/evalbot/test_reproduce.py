"""The report's "Reproduce locally" command: it runs the same evaluation again, with the rules and the
options this one had (#38: it used to leave out --rules, so a contest with its rules elsewhere got a command
that judged under other rules)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from evalbot.evaluate.runner import _reproduce
from evalbot.model import RunOptions


def _cmd(tmp_path: Path, rules_dir: Path, **options) -> str:
    req = SimpleNamespace(options=RunOptions(**options), base_sha="b" * 40, head_sha="h" * 40,
                          profile=SimpleNamespace(name="cpu"))  # fmt: skip
    ws = SimpleNamespace(repo=tmp_path, rules=SimpleNamespace(source_dir=rules_dir))
    return _reproduce(req, ws, 7)  # type: ignore[arg-type]


def test_the_checkouts_own_rules_need_no_flag_and_other_rules_are_named(tmp_path):
    (tmp_path / "rules").mkdir()
    own = _cmd(tmp_path, tmp_path / "rules")
    assert (
        own
        == f"evalbot evaluate --repo {tmp_path} --base {'b' * 40} --head {'h' * 40} --profile cpu --seed 7"
    )
    other = _cmd(tmp_path, tmp_path / "narrowed")
    assert f" --rules {tmp_path / 'narrowed'}" in other


def test_the_options_that_change_the_run_are_in_the_command(tmp_path):
    cmd = _cmd(tmp_path, tmp_path / "rules", accuracy=False, spec_drafter="draft", max_pairs=8)
    assert cmd.endswith(" --spec-drafter draft --no-accuracy --max-pairs 8")
    assert _cmd(tmp_path, tmp_path / "rules", spec=False).endswith(" --no-spec")
