"""`evalbot dashboard build`: the static site from the store and the ledgers.

Unit tests build sites from stores filled through the Store API (empty, a small one with hostile text,
and 3,000 PRs with 10,000 evaluations) and check every page; browser tests load every page in headless
Chromium (playwright) and save screenshots of the main pages under tests/artifacts/dashboard/.
"""

from __future__ import annotations

import html
import random
import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evalbot import dashboard, ledgers
from evalbot.cli import dashboard_cmd
from evalbot.cli import main as cli_main
from evalbot.dashboard import data
from evalbot.model import ContextEstimate, Measurements, Provenance, Status, Verdict
from evalbot.store import Calibration, EvalKey, Store, iso

pytest.importorskip("matplotlib", reason="the dashboard draws its plots with matplotlib")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "dashboard"
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
MODELS = ("qwen2.5-coder-0.5b", "qwen3-0.6b")
CONTEXTS = (512, 4096, 32768)
SPEED = {512: 118.0, 4096: 96.0, 32768: 41.0}  # main's decode tok/s at the start, per context
HOSTILE_TITLE = "<script>alert(1)</script>"
HOSTILE_AUTHOR = '"><img src=x onerror=alert(2)>'
HOSTILE_REASON = "</td></tr></table><iframe src=javascript:alert(3)></iframe>\u202e gnp.exe"
ONE_MB = 1_000_000


# ---------------------------------------------------------------- synthetic stores (through the Store API)


_DRAWN = (Status.PASS, Status.REJECT, Status.INFRA_ERROR, Status.SKIPPED)


def _sha(*parts: object) -> str:
    import hashlib

    return hashlib.sha1("-".join(map(str, parts)).encode()).hexdigest()


def _estimates(
    rng: random.Random, main: dict[tuple[str, int], float], gain: float
) -> tuple[ContextEstimate, ...]:
    out = []
    for model in MODELS:
        for ctx in CONTEXTS:
            base = main[(model, ctx)] * rng.gauss(1.0, 0.01)
            ratio = gain * rng.gauss(1.0, 0.004)
            half = rng.uniform(0.004, 0.02)
            out.append(
                ContextEstimate(
                    model,
                    ctx,
                    "decode_tps",
                    10,
                    base,
                    base * ratio,
                    ratio,
                    ratio - half,
                    ratio + half,
                    half * 1.4,
                    "S" if ratio - half > 1.02 else None,
                    ratio + half < 0.98,
                    True,
                    ctx == 4096,
                )
            )
    return tuple(out)


def populate(
    store: Store,
    prs: int,
    evaluations: int,
    *,
    seed: int = 1,
    hostile: bool = False,
    extras: bool = True,
) -> dict[str, Any]:
    """Fill a store through its API: PRs evaluated against a main that speeds up as winners merge."""
    rng = random.Random(seed)
    main = {(m, c): SPEED[c] * (1.3 if m == "qwen3-0.6b" else 1.0) for m in MODELS for c in CONTEXTS}
    base_sha, t, merged = _sha("main", 0), START, 0
    authors = [f"dev{i}" for i in range(max(prs // 4, 3))]
    for i in range(evaluations):
        pr = i + 1 if i < prs else rng.randint(1, prs)
        t += timedelta(minutes=rng.randint(3, 40))
        head = _sha("head", pr, i)
        key = EvalKey(pr, head, base_sha, "r" * 16)
        store.queue.enqueue_evaluation(key, now=t)
        if i >= evaluations - 3:
            continue  # the newest stay queued
        claimed = store.queue.claim_next("box-1", now=t)
        assert claimed is not None and claimed.key == key
        status = rng.choices(_DRAWN, weights=(30, 50, 12, 8))[0]
        if status is Status.REJECT and i % 9 == 4:
            status = Status.INCONCLUSIVE  # no draw from rng: the rest of the history stays as it was
        gain = rng.uniform(1.01, 1.06) if status is Status.PASS else rng.uniform(0.94, 1.01)
        ests = () if status in (Status.INFRA_ERROR, Status.SKIPPED) else _estimates(rng, main, gain)
        author = authors[pr % len(authors)]
        title = f"Speed up decode path #{pr} (try {i})"
        reasons = (f"{status.value}: measured at ctx 4096",)
        if hostile and pr == 1:
            title, author, reasons = HOSTILE_TITLE, HOSTILE_AUTHOR, (HOSTILE_REASON, "@maintainer see #2")
        verdict = Verdict(status, "S" if status is Status.PASS else None, 4096, (), reasons, (), ests,
                          "r" * 16, 0.012 if ests else None)  # fmt: skip
        prov = Provenance("o/r", base_sha, head, base_sha, "r" * 16, "cuda", pr=pr, title=title, author=author,
                          branch=f"perf/{pr}")  # fmt: skip
        store.queue.finish_evaluation(key, "box-1", verdict, Measurements(prov), now=t + timedelta(minutes=2))
        if status is Status.PASS and rng.random() < min(0.35, 150 / evaluations):  # ~150 merges at most
            t += timedelta(minutes=5)
            store.rounds.record_ledger("merge", pr, head, author, gain - 1.0, gain - 1.0, now=t)
            merged += 1
            for k in main:
                main[k] *= 1 + (gain - 1) * rng.uniform(0.1, 0.6)  # a merge's gain shrinks on the next main
            base_sha = _sha("main", merged)
    if extras:
        for j in range(min(prs, 40)):
            author = HOSTILE_AUTHOR if hostile and j == 0 else authors[j % len(authors)]
            store.moderation.add_strike(
                author, j + 1, "copycat: 91% of #3 without credit", now=START + timedelta(days=j)
            )
        store.moderation.block("dev1", "three copycat strikes", "evalbot", now=START + timedelta(days=3))
        store.moderation.add_clear(
            2, "maintainer", HOSTILE_REASON if hostile else "false positive", now=START
        )
        store.rounds.record_ledger(
            "credit", 3, _sha("head", 3, 2), "dev3", 0.01, 0.004, now=START + timedelta(days=1)
        )
    return {"merges": merged, "last": t}


def calibrations(days: int = 30, boxes: int = 3) -> list[Calibration]:
    """A/A calibrations of a small pool: one box gets noisy halfway through."""
    rng = random.Random(7)
    out = []
    for d in range(days):
        for b in range(boxes):
            for ctx in CONTEXTS:
                noisy = b == 2 and d > days // 2
                cv = rng.uniform(0.004, 0.009) * (3 if noisy else 1)
                fpr = rng.uniform(0.0, 0.08) * (2 if noisy else 1)
                at = iso(START + timedelta(days=d, hours=b))
                # the noisy box's runs agree on a side (calibrate.side_bias), the others' do not
                bias = {"change": -0.0127 if noisy else 0.0005, "t": -5.5 if noisy else 0.4, "t_needed": 2.9,
                        "runs": 20, "agreed": noisy}  # fmt: skip
                out.append(Calibration(at, f"h200-{b}", "cuda", MODELS[0], ctx, 20, fpr, cv * 2.8, cv,
                                       {"side_bias": bias}))  # fmt: skip
    return out


FLAGGED = ledgers.render_flagged(
    [
        ledgers.FlagEntry("2026-01-07", 1, HOSTILE_AUTHOR, "copycat", HOSTILE_REASON),
        ledgers.FlagEntry("2026-01-08", 3, "dev3", "gaming", "env var pin in a benchmark script"),
        ledgers.FlagEntry(
            "2026-01-09", 2, "dev2", "copycat", "copies #1", "cleared by maint: own earlier PR"
        ),
    ]
)
BLOCKED = ledgers.render_blocked(
    [ledgers.BlockedEntry("dev1", "copycat x3"), ledgers.BlockedEntry("spammer")]
)


def _ledger_dir(root: Path, flagged: str = FLAGGED, blocked: str = BLOCKED) -> Path:
    (root / ".github").mkdir(parents=True)
    (root / ledgers.FLAGGED_PATH).write_text(flagged, encoding="utf-8")
    (root / ledgers.BLOCKED_PATH).write_text(blocked, encoding="utf-8")
    return root


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def empty_store(tmp_path: Path):
    with Store(tmp_path / "state.db") as store:
        yield store


@pytest.fixture(scope="module")
def small_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 PRs, 200 evaluations, hostile text, ledgers and calibrations; 25 rows per list page."""
    root = tmp_path_factory.mktemp("small")
    with Store(root / "state.db") as store:
        populate(store, 60, 200, hostile=True)
        for c in calibrations():
            store.calibrations.record(c)
        files = dashboard.read_ledger_dir(_ledger_dir(root / "checkout"))
        dashboard.build_site(store, root / "site", ledger_files=files, per_page=25, now=START)
    return root / "site"


@pytest.fixture(scope="module")
def large_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 PRs and 10,000 evaluations, made through the Store API."""
    path = tmp_path_factory.mktemp("large") / "state.db"
    with Store(path) as store:
        populate(store, 3000, 10_000, seed=3)
    return path


@pytest.fixture(scope="module")
def large_site(
    large_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dashboard.SiteReport]:
    out = tmp_path_factory.mktemp("large-site") / "site"
    with Store(large_store) as store:
        for c in calibrations(days=400, boxes=4):
            store.calibrations.record(c)
        report = dashboard.build_site(store, out, now=START)
    return out, report


def _pages(site: Path) -> list[Path]:
    return sorted(site.glob("*.html"))


def _page_weight(page: Path) -> int:
    """The bytes a browser loads for a page: its HTML, the stylesheet and the plots it shows."""
    text = page.read_text(encoding="utf-8")
    extra = {page.parent / "style.css"} | {
        page.parent / src for src in re.findall(r'src="(plots/[^"]+)"', text)
    }
    return len(text.encode("utf-8")) + sum(p.stat().st_size for p in extra)


def _links(page: Path) -> set[str]:
    return set(re.findall(r'(?:href|src)="([^"#:]+)"', page.read_text(encoding="utf-8")))


# ---------------------------------------------------------------- pure parts


def test_frontier_pools_evaluations_per_main_commit(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        info = populate(store, 10, 40, extras=False)
        series = dashboard.frontier(store.queue.evaluations())
        marks = dashboard.merges(store.rounds.ledger())
    assert {(s.model, s.context) for s in series} == {(m, c) for m in MODELS for c in CONTEXTS}
    assert len(marks) == info["merges"] > 0
    for s in series:
        assert [p.at for p in s.points] == sorted(p.at for p in s.points)
        assert len({p.base_sha for p in s.points}) == len(s.points) <= info["merges"] + 1
    # main got faster with every merge: the last main beats the first at every context
    assert all(s.latest.value > s.points[0].value for s in series)


def test_downsample_keeps_the_shape_and_the_count() -> None:
    pts = [dashboard.FrontierPoint(START + timedelta(hours=i), float(i), f"s{i}", 1) for i in range(1000)]
    out = dashboard.downsample(pts, 100)
    assert len(out) == 100
    assert sum(p.n for p in out) == 1000
    assert [p.value for p in out] == sorted(p.value for p in out)
    assert dashboard.downsample(pts[:50], 100) == pts[:50]


def test_verdict_history_picks_a_period_that_keeps_bars_few(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        populate(store, 30, 120, extras=False)
        recs = store.queue.evaluations()
    hist = dashboard.verdict_history(recs, max_bars=80)
    assert hist.total == sum(1 for r in recs if dashboard.outcome(r))
    assert len(hist.starts) <= 80
    assert dashboard.verdict_history([]).total == 0


def test_forest_geometry_puts_main_between_the_bars() -> None:
    e = ContextEstimate(
        "m", 512, "decode_tps", 10, 100.0, 104.0, 1.04, 1.02, 1.06, 0.01, "S", False, True, True
    )
    r = ContextEstimate(
        "m", 4096, "decode_tps", 10, 90.0, 85.0, 0.944, 0.93, 0.96, 0.01, None, True, True, False
    )
    f = dashboard.forest([e, r])
    assert f is not None
    gain, regression = f.rows
    assert (gain.kind, regression.kind) == ("gain", "regression")
    assert regression.x_hi < f.x_one < gain.x_lo
    assert f.left <= min(x for x, _ in f.ticks) and max(x for x, _ in f.ticks) <= f.right_edge
    assert gain.text == "+4.0% [+2.0%, +6.0%]"
    nan = ContextEstimate(
        "m", 1, "decode_tps", 0, 0.0, 0.0, float("nan"), 0.0, 0.0, 0.0, None, False, True, True
    )
    assert dashboard.forest([nan]) is None


def test_pager_links_first_last_and_neighbours() -> None:
    pages = list(dashboard.paginate(list(range(95)), "prs", 10))
    assert len(pages) == 10 and len(pages[-1][1]) == 5
    pager = pages[4][0]
    assert pager.numbers == [1, None, 3, 4, 5, 6, 7, None, 10]
    assert pager.href(1) == "prs.html" and pager.href(2) == "prs-2.html"
    assert len(list(dashboard.paginate([], "prs", 10))) == 1


def test_ledger_view_keeps_a_broken_file_as_an_error() -> None:
    view = dashboard.ledger_view(dashboard.LedgerFiles("| x | no | row |\n", "not a login!\n", "checkout"))
    assert view.given and not view.flags and not view.blocked
    assert len(view.errors) == 2 and "FLAGGED.md:1" in view.errors[0]
    assert not dashboard.ledger_view(dashboard.LedgerFiles()).given


# ---------------------------------------------------------------- whole sites


def test_empty_store_renders_every_page(empty_store: Store, tmp_path: Path) -> None:
    report = dashboard.build_site(empty_store, tmp_path / "site", now=START)
    site = tmp_path / "site"
    names = {p.name for p in _pages(site)}
    assert names == {"index.html", "frontier.html", "prs.html", "ledgers.html", "flagged.html",
                     "strikes.html", "blocked.html", "noise.html"}  # fmt: skip
    assert set(report.pages) == names
    assert "No evaluation has finished yet" in (site / "frontier.html").read_text()
    assert "No pull request has been queued yet" in (site / "prs.html").read_text()
    assert "No calibration yet" in (site / "noise.html").read_text()
    assert "No ledger files were given" in (site / "ledgers.html").read_text()
    assert not list(site.glob("plots/*.svg"))
    for page in _pages(site):
        assert page.read_text().startswith("<!doctype html>")
        for link in _links(page):
            assert (site / link).is_file(), f"{page.name} links to missing {link}"


def test_small_site_links_resolve_and_numbers_show(small_site: Path) -> None:
    pages = _pages(small_site)
    assert len([p for p in pages if p.name.startswith("pr-")]) == 60
    assert {"prs-2.html", "prs-3.html", "flagged.html", "strikes-2.html"} <= {p.name for p in pages}
    for page in pages:
        for link in _links(page):
            assert (small_site / link).is_file(), f"{page.name} links to missing {link}"
    index = (small_site / "index.html").read_text()
    assert "Main's throughput now" in index and "qwen3-0.6b" in index
    assert len(list((small_site / "plots").glob("frontier-*.svg"))) == len(MODELS)
    noise = (small_site / "noise.html").read_text()
    assert "plots/noise-0-cuda.svg" in noise and "h200-2" in noise
    assert "main 1.27% faster (t -5.5, 20 runs)" in noise and "<td>none</td>" in noise  # the side bias column
    pr = (small_site / "pr-5.html").read_text()
    assert '<svg class="forest"' in pr and "Verdict history" in pr


def test_hostile_text_is_escaped_everywhere(small_site: Path) -> None:
    for page in _pages(small_site):
        text = page.read_text(encoding="utf-8")
        assert "<script" not in text.lower(), page.name
        assert "<iframe" not in text.lower(), page.name
        assert "<img src=x" not in text, page.name
        assert "\u202e" not in text, page.name  # bidi overrides dropped
    pr1 = (small_site / "pr-1.html").read_text(encoding="utf-8")
    assert html.escape(HOSTILE_TITLE, quote=False) in pr1
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in pr1
    assert "&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;iframe" in pr1
    ledger = (small_site / "flagged.html").read_text(encoding="utf-8")
    assert "&lt;iframe src=javascript:alert(3)&gt;" in ledger
    for svg in (small_site / "plots").glob("*.svg"):
        assert "<script" not in svg.read_text(encoding="utf-8")


def test_rebuild_removes_only_what_a_build_wrote(tmp_path: Path) -> None:
    site = tmp_path / "site"
    with Store(tmp_path / "s.db") as store:
        populate(store, 5, 12, extras=False)
        dashboard.build_site(store, site, now=START)
    assert (site / "pr-5.html").is_file()
    (site / "notes.txt").write_text("mine")
    with Store(tmp_path / "empty.db") as empty:
        dashboard.build_site(empty, site, now=START)
    assert not (site / "pr-5.html").exists() and not list((site / "plots").glob("*.svg"))
    assert (site / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "index.html").write_text("someone else's")
    with Store(tmp_path / "empty.db") as empty, pytest.raises(ValueError, match="no dashboard build wrote"):
        dashboard.build_site(empty, other)


def test_thousands_of_prs_build_fast_and_every_page_stays_under_1mb(large_site) -> None:
    site, report = large_site
    pages = _pages(site)
    assert len([p for p in pages if p.name.startswith("pr-")]) == 3000
    assert len([p for p in pages if p.name.startswith("prs")]) == 15  # 200 per page
    print(f"\n3,000 PRs / 10,000 evaluations: {len(pages)} pages, {report.files} files in {report.seconds:.1f} s; "
          f"largest page {report.largest[0]} {report.largest[1] / 1000:.0f} kB")  # fmt: skip
    assert report.seconds < 120
    for page in pages:
        assert _page_weight(page) < ONE_MB, page.name
    assert max(report.pages.values()) < ONE_MB
    assert report.pages["index.html"] == _page_weight(site / "index.html")


def test_cli_builds_from_a_state_and_a_ledger_dir(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        populate(store, 8, 20, hostile=True)
    _ledger_dir(tmp_path / "checkout")
    result = CliRunner().invoke(cli_main, ["dashboard", "build", "--out", str(tmp_path / "site"), "--state",
                                           str(tmp_path / "state.db"), "--ledger-dir", str(tmp_path / "checkout")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pages" in result.output and "largest" in result.output
    assert "copies #1" in (tmp_path / "site" / "flagged.html").read_text()
    missing = CliRunner().invoke(
        cli_main, ["dashboard", "build", "--out", str(tmp_path / "x"), "--state", str(tmp_path / "nope.db")]
    )
    assert missing.exit_code != 0 and "no state" in missing.output
    assert not (tmp_path / "nope.db").exists()
    both = CliRunner().invoke(cli_main, ["dashboard", "build", "--out", str(tmp_path / "y"), "--state",
                                         str(tmp_path / "state.db"), "--ledger-dir", str(tmp_path / "checkout"),
                                         "--git-remote", "file:///nowhere"])  # fmt: skip
    assert both.exit_code != 0 and "not both" in both.output


def test_cli_reads_the_ledgers_from_a_git_remote(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    remote = tmp_path / "remote.git"
    import subprocess

    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    ledgers.commit_ledgers(
        str(remote), {ledgers.FLAGGED_PATH: FLAGGED, ledgers.BLOCKED_PATH: BLOCKED}, "seed"
    )
    with Store(tmp_path / "state.db"):
        pass
    result = CliRunner().invoke(cli_main, ["dashboard", "build", "--out", str(tmp_path / "site"), "--state",
                                           str(tmp_path / "state.db"), "--git-remote", str(remote)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "spammer" in (tmp_path / "site" / "blocked.html").read_text()


def test_cli_never_shows_the_token_in_a_remote(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db"):
        pass
    # a closed port on the loopback: git fails at once, and its error quotes the remote
    remote = "http://x-access-token:SECRET123@127.0.0.1:9/o/r.git"
    result = CliRunner().invoke(cli_main, ["dashboard", "build", "--out", str(tmp_path / "site"), "--state",
                                           str(tmp_path / "state.db"), "--git-remote", remote])  # fmt: skip
    assert result.exit_code != 0
    assert "SECRET123" not in result.output and "127.0.0.1:9/o/r.git" in result.output
    assert dashboard_cmd._shown_remote(f"from {remote} (b)") == "from http://127.0.0.1:9/o/r.git (b)"


# ---------------------------------------------------------------- in a real browser


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    if not shutil.which("chromium"):
        return "no chromium on PATH (apt-get install -y chromium)"
    return None


browser_test = pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@dataclass
class Visit:
    errors: list[str]
    broken_images: list[str]
    title: str


def _visit(browser: Any, page_path: Path, screenshot: Path | None = None, full_page: bool = True) -> Visit:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on(
        "console",
        lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} {req.failure}"))
    page.on("dialog", lambda d: (errors.append(f"dialog: {d.message}"), d.dismiss()))
    try:
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        broken = page.evaluate(
            "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
        )
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=full_page)
        return Visit(errors, broken, page.title())
    finally:
        page.close()


@browser_test
def test_browser_loads_every_page_of_the_empty_site(browser, empty_store: Store, tmp_path: Path) -> None:
    dashboard.build_site(empty_store, tmp_path / "site", now=START)
    for page in _pages(tmp_path / "site"):
        shot = ARTIFACTS / f"empty-{page.stem}.png" if page.name in ("index.html", "noise.html") else None
        visit = _visit(browser, page, shot)
        assert visit.errors == [] and visit.broken_images == [], page.name
        assert visit.title.endswith("· evalbot")


@browser_test
def test_browser_loads_every_page_of_a_hostile_site(browser, small_site: Path) -> None:
    main_pages = {"index", "frontier", "prs", "pr-1", "pr-5", "ledgers", "flagged", "noise"}
    pages = _pages(small_site)
    for page in pages:
        shot = ARTIFACTS / f"{page.stem}.png" if page.stem in main_pages else None
        visit = _visit(browser, page, shot)
        assert visit.errors == [], (page.name, visit.errors)
        assert visit.broken_images == [], (page.name, visit.broken_images)
    assert _visit(browser, small_site / "pr-1.html").title.startswith("#1 <script>alert(1)</script>")


@browser_test
def test_browser_loads_the_main_pages_of_the_large_site(browser, large_site) -> None:
    site, _ = large_site
    names = ["index.html", "frontier.html", "prs.html", "prs-15.html", "pr-1.html", "pr-3000.html",
             "ledgers.html", "noise.html"]  # fmt: skip
    for name in names:
        shot = (
            ARTIFACTS / f"large-{Path(name).stem}.png"
            if name in ("index.html", "frontier.html", "prs.html", "noise.html")
            else None
        )
        t0 = time.perf_counter()
        visit = _visit(browser, site / name, shot, full_page=False)
        assert visit.errors == [] and visit.broken_images == [], (name, visit.errors, visit.broken_images)
        assert time.perf_counter() - t0 < 10


def test_a_calibrations_side_bias_reads_as_the_side_equal_code_favours_or_none():
    agreed = {"side_bias": {"change": 0.0079, "t": 7.9, "t_needed": 4.6, "runs": 5, "agreed": True}}
    assert data.side_bias_note(agreed) == "PR 0.79% faster (t +7.9, 5 runs)"
    assert data.side_bias_note({"side_bias": {**agreed["side_bias"], "agreed": False}}) == "none"
    for details in ({}, {"side_bias": None}, None, "x", {"side_bias": {"change": "1", "t": 2, "runs": 3}},
                    {"side_bias": {"change": float("nan"), "t": 2.0, "runs": 3, "agreed": True}}):  # fmt: skip
        assert data.side_bias_note(details) == "—"
