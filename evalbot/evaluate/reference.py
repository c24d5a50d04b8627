"""The harness's trusted steps: the model fetcher, the llama.cpp reference, each side's accuracy against it,
and the reference's answers for the decode audit.

The tools are evalbot's own (`evalbot.reference`, run from the harness's interpreter), or, where engine.yaml
says `reference: main`, main's build package's (`<package>.reference`, `.compare`, `.registry` in main's
venv: an architecture llama.cpp cannot run). Never the PR's. The fetcher and the reference run trusted,
outside the sandbox (the fetcher needs the network; the reference's cache persists across evaluations);
the comparison reads what the engines wrote as data only: evalbot's in this process (numpy, no pickles),
main's sandboxed like everything else. A failure here is the harness's, except where a side's own engine is
at fault (it wrote no scores, or it changed tokenization): that is the side's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
from functools import partial
from pathlib import Path
from typing import Any

from evalbot.evaluate import ab_samples, audit, sandbox, schedule, serve_error, served
from evalbot.evaluate.context import RunContext, SideFailed, fresh_scratch, sandboxed_python
from evalbot.evaluate.exits import describe_exit
from evalbot.evaluate.speculative import drafts
from evalbot.model import AccuracyResult, Failure, Side
from evalbot.reference import compare as compare_scores
from evalbot.reference.registry import sha256_file
from evalbot.rules import Profile

REFERENCE_TIMEOUT_S = 1800
TAIL_CHARS = 2000


def _harness_failed(stage: str, message: str, output: str = "") -> SideFailed:
    """A failure of the harness's own step at `stage`, with the end of what its tool printed."""
    return SideFailed(Failure(Side.HARNESS, stage, message, output[-TAIL_CHARS:]))


def _from_main(ctx: RunContext) -> bool:
    """Whether main's build package brings the reference tools (engine.yaml `reference: main`)."""
    return ctx.ws.rules.engine.reference == "main"


def _tool_argv(ctx: RunContext, tool: str) -> list[str]:
    """`python -I -m` one reference tool (reference, registry): evalbot's own with the harness's interpreter,
    or main's package's in main's venv. -I and a neutral cwd: `-m` would otherwise put the working
    directory (which may hold an `engine/` or an `evalbot/` of its own) ahead of the installed code."""
    if _from_main(ctx):
        venv = ctx.sides[Side.BASE].build.venv
        assert venv is not None
        return [str(venv / "bin" / "python"), "-I", "-m", f"{ctx.ws.rules.engine.package}.{tool}"]
    return [
        sys.executable,
        "-I",
        "-m",
        "evalbot.reference" if tool == "reference" else f"evalbot.reference.{tool}",
    ]


def _main_tool(
    ctx: RunContext,
    tool: str,
    args: list[str],
    *,
    stage: str,
    what: str,
    timeout_s: float,
    cwd: Path,
    max_output_bytes: int = 64 << 20,
) -> sandbox.RunResult:
    """Run one reference tool trusted, outside the sandbox; one that fails is the harness's failure at
    `stage`, `what` naming the tool before how it ended."""
    res = sandbox.run_trusted(
        [*_tool_argv(ctx, tool), *args],
        timeout_s=timeout_s,
        cwd=cwd,
        max_output_bytes=max_output_bytes,
    )
    if not res.ok:
        exit_ = describe_exit(res.returncode, timed_out=res.timed_out, timeout_s=timeout_s)
        raise _harness_failed(stage, f"{what} {exit_}", res.stderr)
    return res


def llama_reference(ctx: RunContext, path: Path, text: Path) -> tuple[Path, dict[str, Any]]:
    """llama.cpp's log-probs for the accuracy text (computed, or loaded from its cache), and its identity.

    The reference is harness code (evalbot's llama.cpp and its tokenizer, or main's own), run trusted so that its
    cache (keyed by model sha256, the reference build's identity and the token ids) persists across
    evaluations. It runs before the PR is built or any pair is timed: a reference that cannot run ends
    the evaluation at once, saying how it died.
    """
    p = ctx.req.options.positions
    ref = ctx.scratch / "reference" / f"{path.stem}.npy"
    ref.parent.mkdir(exist_ok=True)
    ctx.log(f"{path.stem}: llama.cpp reference over {p} positions")
    args = ["score", "--model", str(path), "--text-file", str(text), "--positions", str(p), "--out", str(ref)]
    res = _main_tool(
        ctx,
        "reference",
        args,
        stage="reference",
        what="the llama.cpp reference",
        timeout_s=REFERENCE_TIMEOUT_S,
        cwd=ref.parent,
        max_output_bytes=1 << 20,
    )
    try:
        record = json.loads(res.stdout.strip().splitlines()[-1])
        config = record.get("config") or {}
    except (ValueError, IndexError, AttributeError, TypeError) as exc:
        raise _harness_failed(
            "reference", f"the llama.cpp reference printed no record: {exc}", res.stdout + res.stderr
        ) from exc
    identity = {
        "engine": record.get("engine"),
        "cached": bool(record.get("cached")),
        **(config.get("reference_build") or {"version": config.get("llama_cpp")}),
    }
    return ref, identity


def accuracy_served(
    ctx: RunContext, name: str, procs: dict[Side, served.ServedProcess], ref: Path
) -> AccuracyResult:
    """Each side's serving engine scores the reference's token ids (teacher-forced, every position's full
    log-probabilities written to its scratch), each set against the reference's."""
    try:
        record = json.loads(Path(f"{ref}.json").read_text())
        ids = record["token_ids"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _harness_failed("reference", f"the reference left no token ids: {exc}") from exc
    reference = str(record.get("engine") or "the reference")[:40]
    ctx.log(f"{name}: accuracy vs {reference} over {len(ids) - 1} positions")
    outs: dict[Side, Path] = {}
    for side, p in procs.items():
        others = [q for s, q in procs.items() if s is not side]
        name_npy = f"{side.value}-score.npy"
        try:
            schedule.run_alone(
                p,
                others,
                partial(
                    p.request, {"op": "score", "ids": ids, "from": 1, "save": name_npy}, ctx.run_timeout_s
                ),
            )
        except serve_error.ServeError as exc:
            raise ab_samples.SideError(side, exc.stage, str(exc), exc.tail) from exc
        made = ctx.serve_scratch[side] / name_npy
        if not made.is_file() or made.is_symlink():
            found = (
                sorted(x.name for x in ctx.serve_scratch[side].iterdir())[:20]
                if ctx.serve_scratch[side].is_dir()
                else "no folder"
            )
            raise SideFailed(
                Failure(
                    side,
                    "accuracy",
                    f"the engine wrote no {name_npy} in its working directory "
                    f"{ctx.serve_scratch[side]} (it holds: {found})",
                )
            )
        # compared from the harness's own folder: a copy of the scores (read without following a link, a
        # regular file only) and the sidecar beside it, the ids the reference scored, never what the engine
        # says. Written in the engine's folder, the sidecar followed a link the engine had left there: a
        # PR's `head-score.npy.json -> ../../base/work/base-score.npy` overwrote main's scores.
        outs[side] = _kept_scores(made, ctx.scratch / "accuracy" / name_npy, side)
        Path(f"{outs[side]}.json").write_text(json.dumps({"token_ids": ids}))
    base_stats = _compare(ctx, ref, outs[Side.BASE], Side.BASE)
    head_stats = _compare(ctx, ref, outs[Side.HEAD], Side.HEAD)
    return AccuracyResult(
        name,
        len(ids) - 1,
        float(head_stats["top1_agreement"]),
        float(head_stats["kl_mean"]),
        float(head_stats["ppl_ratio"]),
        base_top1_agreement=float(base_stats["top1_agreement"]),
        base_kl_mean=float(base_stats["kl_mean"]),
        reference=reference,
        ppl=_finite(head_stats.get("ppl_test")),
        base_ppl=_finite(base_stats.get("ppl_test")),
        reference_ppl=_finite(head_stats.get("ppl_ref")),
    )


def _finite(value: Any) -> float | None:
    """A perplexity from a comparison's record (main's own tool may give none, or garbage): a finite number or None."""
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


MAX_SCORES_BYTES = 2 << 30  # a [positions, vocab] float32 array of the shipped models is about 80 MB


def _kept_scores(made: Path, dest: Path, side: Side) -> Path:
    """A copy of an engine's score file in a folder of the harness's: opened without following a link, a
    regular file of at most MAX_SCORES_BYTES, streamed. Anything else is the side's failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(made, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise SideFailed(Failure(side, "accuracy", f"cannot read {made.name}: {exc.strerror}")) from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SCORES_BYTES:
        os.close(fd)
        why = f"{made.name} is not a regular file of at most {MAX_SCORES_BYTES} bytes"
        raise SideFailed(Failure(side, "accuracy", why))
    with os.fdopen(fd, "rb") as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return dest


def _compare(ctx: RunContext, ref: Path, test: Path, side: Side) -> dict[str, Any]:
    """A side's scores against the reference's: evalbot's comparison here, reading both as data (numpy,
    memory-mapped, no pickles), or main's `<package>.compare` sandboxed like everything else. Scores that
    cannot be compared (other token ids, another shape, garbage) are that side's fault."""
    if not _from_main(ctx):
        try:
            return compare_scores.compare_files(ref, test)
        except (compare_scores.CompareError, ValueError, OSError) as exc:
            raise SideFailed(
                Failure(side, "accuracy", f"cannot compare with the reference: {exc}"[:600])
            ) from exc
    venv = ctx.sides[Side.BASE].build.venv
    assert venv is not None
    scratch = fresh_scratch(ctx, "compare")
    try:
        res = sandboxed_python(
            ctx,
            venv,
            scratch,
            [f"{ctx.ws.rules.engine.package}.compare", str(ref), str(test), "--json"],
            [ref.parent, test.parent],
            600,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if res.returncode != 0:
        # different token ids mean the side changed tokenization: that side's fault
        raise SideFailed(
            Failure(side, "accuracy", "cannot compare with the reference: " + res.stderr.strip()[-500:])
        )
    return json.loads(res.stdout)


def audit_answers(
    ctx: RunContext,
    chosen: list[ab_samples.Sample],
    procs: dict[Side, served.ServedProcess],
    registry: bool,
    name: str,
) -> tuple[dict[str, dict[str, Any]], str]:
    """The reference's argmax and margins for each audited request: llama.cpp on the model file, or main's
    own serving engine where the weights are random (teacher-forced on the side's tokens either way)."""
    if not chosen:
        return {}, "none"
    if registry:
        folder = ctx.scratch / "audit"
        folder.mkdir(exist_ok=True)
        requests, answers = folder / "requests.jsonl", folder / "answers.jsonl"
        requests.write_text(audit.requests_file(chosen))
        model = ctx.model_paths[name]
        ctx.log(f"{name}: auditing {len(chosen)} timed requests against the reference")
        res = _main_tool(
            ctx,
            "reference",
            [
                "audit",
                "--model",
                str(model),
                "--requests",
                str(requests),
                "--out",
                str(answers),
            ],
            stage="reference",
            what="the reference's audit",
            timeout_s=REFERENCE_TIMEOUT_S,
            cwd=folder,
            max_output_bytes=1 << 20,
        )
        out = {}
        for line in answers.read_text().splitlines():
            item = json.loads(line)
            out[item["key"]] = item
        try:
            engine = json.loads(res.stdout.strip().splitlines()[-1]).get("engine") or "reference"
        except (ValueError, IndexError, AttributeError):
            engine = "reference"
        return out, str(engine)
    main = procs[Side.BASE]
    head = [p for s, p in procs.items() if s is not Side.BASE]
    out = {}
    for s in chosen:
        req = {"op": "score", "ids": [*s.prompt, *s.tokens], "from": len(s.prompt)}
        got = schedule.run_alone(main, head, partial(main.request, req, ctx.run_timeout_s))
        out[audit.key(s)] = got.summary
    return out, "main"


# --- trusted helpers --------------------------------------------------------------------------------


def fetch_models(ctx: RunContext, profile: Profile) -> dict[str, Path]:
    """Registry models fetched and verified by the reference's fetcher (trusted, outside the sandbox: it needs
    the network); model files on the runner checked against their pinned digest, computed here."""
    files = _runner_files(ctx, profile)
    names = [m.name for m in profile.models if m.source == "registry"]
    if drafts(ctx):
        names += [ctx.ws.rules.spec_pair.target.name, ctx.ws.rules.spec_pair.draft.name]
    out: dict[str, Path] = {}
    for name in dict.fromkeys(names):
        ctx.log(f"fetching {name}")
        res = _main_tool(
            ctx,
            "registry",
            ["fetch", name],
            stage="models",
            what=f"cannot fetch {name}: the fetcher",
            timeout_s=3600,
            cwd=ctx.scratch,
        )
        lines = res.stdout.strip().splitlines()
        if not lines or not Path(lines[-1]).is_file():
            raise _harness_failed("models", f"the fetcher named no file for {name}", res.stdout + res.stderr)
        out[name] = Path(lines[-1])
    pinned = {m.name: m.sha256 for m in profile.models if m.sha256}
    for ref in (ctx.ws.rules.spec_pair.target, ctx.ws.rules.spec_pair.draft):
        if ref.sha256:
            pinned[ref.name] = ref.sha256
    for name, path in out.items():
        digest = sha_of(ctx, path)
        if name in pinned and pinned[name] != digest:
            raise _harness_failed("models", f"{name} has sha256 {digest}, rules pin {pinned[name]}")
    return out | files


def _runner_files(ctx: RunContext, profile: Profile) -> dict[str, Path]:
    """The models.yaml entries that name a file on the runner, each read whole and its digest compared with
    the pinned one (never a .sha256 file beside it: anyone who can write the folder could write that)."""
    refs = [m for m in profile.models if m.source == "file"]
    if drafts(ctx):
        refs += [
            m for m in (ctx.ws.rules.spec_pair.target, ctx.ws.rules.spec_pair.draft) if m.source == "file"
        ]
    out: dict[str, Path] = {}
    for ref in refs:
        path = Path(ref.path or "")
        if not path.is_file():
            raise _harness_failed(
                "models", f"{ref.name}: the rules name the file {path}, which this runner lacks"
            )
        ctx.log(f"checking {ref.name} ({path})")
        digest = sha256_file(path)
        if digest != ref.sha256:
            raise _harness_failed(
                "models", f"{ref.name}: {path} has sha256 {digest}, the rules pin {ref.sha256}"
            )
        out[ref.name] = path
    return out


def model_binds(models: dict[str, Path], on_runner: set[str]) -> list[Path]:
    """What the sandbox may read of the models: a fetched model's cache folder (the fetcher's own), but of a
    file on the runner only the file: its folder may hold anything (a home directory, the runner's key)."""
    return [path if name in on_runner else path.parent for name, path in models.items()]


def sha_of(ctx: RunContext, path: Path) -> str:
    """A model file's sha256: from the fetcher's .sha256 file beside it, else computed."""
    side = path.with_name(path.name + ".sha256")
    try:
        return side.read_text().split()[1]
    except (OSError, IndexError):
        return sha256_file(path)
