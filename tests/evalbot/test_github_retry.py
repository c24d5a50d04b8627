"""Pure GitHub rules: rate-limit waits, backoff, when to give up, Link pagination, safe artifact unzip."""

from __future__ import annotations

import random
import stat
import zipfile
from pathlib import Path

import pytest

from evalbot.github import ArtifactRejected, extract_zip_safely, next_link
from evalbot.github_retry import (
    SECONDARY_DEFAULT_WAIT,
    RetryPolicy,
    backoff_delay,
    is_secondary_limit_message,
    next_step,
    rate_limit_wait,
)
from tests.github_double.state import SECONDARY_LIMIT_MESSAGE, zip_bytes

NOW = 1_800_000_000.0


def test_retry_after_is_a_secondary_limit_of_that_many_seconds_in_any_header_case():
    wait = rate_limit_wait(403, {"Retry-After": "37"}, "", NOW)
    assert (wait.seconds, wait.kind) == (37.0, "secondary")
    assert rate_limit_wait(429, {"retry-after": "5"}, "", NOW).seconds == 5.0


def test_retry_after_zero_still_waits_a_second_so_a_loop_cannot_spin():
    assert rate_limit_wait(403, {"Retry-After": "0"}, "", NOW).seconds == 1.0


def test_primary_limit_waits_until_reset_plus_slack():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) + 120)}
    wait = rate_limit_wait(403, headers, "API rate limit exceeded for user ID 1.", NOW)
    assert (wait.seconds, wait.kind) == (121.0, "primary")


def test_primary_limit_with_a_reset_already_past_waits_only_the_slack():
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW) - 30)}
    assert rate_limit_wait(403, headers, "", NOW).seconds == 1.0


def test_secondary_limit_message_without_retry_after_waits_a_minute():
    assert rate_limit_wait(403, {}, SECONDARY_LIMIT_MESSAGE, NOW).seconds == SECONDARY_DEFAULT_WAIT
    assert rate_limit_wait(429, {}, "", NOW).seconds == SECONDARY_DEFAULT_WAIT


def test_a_plain_403_or_other_status_is_no_rate_limit():
    assert (
        rate_limit_wait(403, {"X-RateLimit-Remaining": "4999"}, "Resource not accessible by integration", NOW)
        is None
    )
    assert rate_limit_wait(404, {"Retry-After": "5"}, "Not Found", NOW) is None
    assert rate_limit_wait(502, {}, "Server Error", NOW) is None


def test_an_unreadable_retry_after_falls_back_to_the_other_signals():
    assert rate_limit_wait(403, {"Retry-After": "soon"}, "", NOW) is None
    assert rate_limit_wait(403, {"Retry-After": "soon"}, SECONDARY_LIMIT_MESSAGE, NOW).seconds == 60.0


@pytest.mark.parametrize(
    "message, expected",
    [
        ("You have exceeded a secondary rate limit and have been temporarily blocked.", True),
        ("You have triggered an abuse detection mechanism. Please retry your request again later.", True),
        ("Something. Please wait a few minutes before you try again.", True),
        ("API rate limit exceeded for 1.2.3.4.", False),
        ("Not Found", False),
    ],
)
def test_secondary_limit_messages(message, expected):
    assert is_secondary_limit_message(message) is expected


def test_backoff_doubles_with_half_jitter_and_is_capped():
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0)
    rng = random.Random(7)
    for fault, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 8.0), (9, 8.0)]:
        for _ in range(50):
            assert ceiling / 2 <= backoff_delay(fault, policy, rng) <= ceiling


def test_backoff_is_reproducible_with_a_seeded_rng():
    policy = RetryPolicy()
    assert [backoff_delay(i, policy, random.Random(3)) for i in range(4)] == [
        backoff_delay(i, policy, random.Random(3)) for i in range(4)
    ]


def _step(status, headers=None, message="boom", **kw):
    args = {
        "now": NOW,
        "idempotent": True,
        "faults": 0,
        "rate_waited": 0.0,
        "policy": RetryPolicy(),
        "rng": random.Random(0),
    }
    return next_step(status, headers or {}, message, **(args | kw))


def test_server_faults_and_timeouts_are_retried_with_backoff():
    for status in (500, 502, 503, 504, None):
        step = _step(status)
        assert step.wait is not None and 0.5 <= step.wait <= 1.0 and not step.rate_limited


def test_give_up_after_the_attempts_with_an_infra_fault():
    step = _step(502, message="Server Error", faults=4)
    assert step.wait is None and step.infra
    assert step.reason == "Server Error (gave up after 5 attempts)"


def test_a_refusal_stops_at_once_and_is_not_infra():
    step = _step(422, message="Validation Failed")
    assert (step.wait, step.infra, step.reason) == (None, False, "Validation Failed")


def test_a_non_idempotent_request_is_not_retried_after_an_ambiguous_fault():
    for status in (502, None):
        step = _step(status, idempotent=False)
        assert step.wait is None and step.infra and "may have been applied" in step.reason


def test_a_rate_limited_non_idempotent_request_is_retried_because_nothing_was_applied():
    step = _step(403, {"Retry-After": "30"}, idempotent=False)
    assert (step.wait, step.rate_limited) == (30.0, True)


def test_rate_limit_waits_stop_at_the_cap_with_a_reason():
    policy = RetryPolicy(max_rate_wait=100)
    step = _step(403, {"Retry-After": "60"}, "slow down", rate_waited=50.0, policy=policy)
    assert step.wait is None and step.infra
    assert "secondary rate limit" in step.reason and "cap of 100s" in step.reason and "50s" in step.reason


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"attempts": 0}, "attempts must be at least 1"),
        ({"base_delay": 5.0, "max_delay": 1.0}, "base_delay <= max_delay"),
        ({"max_rate_wait": -1}, "max_rate_wait must be >= 0"),
    ],
)
def test_retry_policy_rejects_nonsense(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_next_link_finds_rel_next_among_others():
    header = (
        '<https://api.github.com/repositories/1/pulls?page=3>; rel="next", '
        '<https://api.github.com/repositories/1/pulls?page=5>; rel="last", '
        '<https://api.github.com/repositories/1/pulls?page=1>; rel="first"'
    )
    assert next_link(header) == "https://api.github.com/repositories/1/pulls?page=3"
    assert next_link('<https://x/y?page=1>; rel="prev", <https://x/y?page=1>; rel="first"') is None
    assert next_link("") is None


def test_extract_zip_unpacks_nested_files_and_replaces_an_earlier_copy(tmp_path: Path):
    dest = tmp_path / "artifact-1"
    dest.mkdir()
    (dest / "stale.txt").write_text("from an earlier download")
    out = extract_zip_safely(zip_bytes({"result.json": '{"ok": true}', "logs/run.txt": "line\n"}), dest)
    assert out == dest
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "logs/run.txt",
        "result.json",
    ]
    assert (dest / "logs" / "run.txt").read_text() == "line\n"
    assert [p.name for p in tmp_path.iterdir()] == ["artifact-1"]  # no staging folder left behind


@pytest.mark.parametrize(
    "name, reason",
    [
        ("../evil.txt", "outside the artifact folder"),
        ("ok/../../evil.txt", "outside the artifact folder"),
        ("/etc/evil", "outside the artifact folder"),
        ("C:/evil.txt", "outside the artifact folder"),
        ("..\\evil.txt", "unusable name"),
    ],
)
def test_extract_zip_refuses_escaping_members_and_writes_nothing(tmp_path: Path, name: str, reason: str):
    data = zip_bytes({"fine.txt": "x", name: "pwned"})
    with pytest.raises(ArtifactRejected, match=reason):
        extract_zip_safely(data, tmp_path / "out" / "artifact-2")
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_extract_zip_refuses_symlinks(tmp_path: Path):
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        link = zipfile.ZipInfo("link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(ArtifactRejected, match="symbolic link"):
        extract_zip_safely(buf.getvalue(), tmp_path / "a")


def test_extract_zip_refuses_oversize_content_and_non_zips(tmp_path: Path):
    with pytest.raises(ArtifactRejected, match="more than the limit of 10"):
        extract_zip_safely(zip_bytes({"big.bin": b"\0" * 11}), tmp_path / "a", max_bytes=10)
    with pytest.raises(ArtifactRejected, match="not a zip archive"):
        extract_zip_safely(b"<html>expired</html>", tmp_path / "b")
