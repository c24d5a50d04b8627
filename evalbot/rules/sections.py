"""The loaders of the four rules files about PRs and the bot's conduct rather than measurement:
``copycat.yaml``, ``policy.yaml``, ``automerge.yaml`` and ``dispatch.yaml``. ``load_rules``
(``evalbot.rules.load``) calls them in its order; they read nodes only through ``reader``'s ``_File``, so
this module does not import yaml itself."""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Sequence
from typing import Any

from evalbot.rules.reader import _MODULE, _did_you_mean, _File, _join, _Node
from evalbot.rules.schema import (
    _LOGIN,
    BUILD_FIELDS,
    DISPATCH_MODES,
    HTTP_PROTOCOLS,
    PROTOCOLS,
    REFERENCES,
    SERVE_FIELDS,
    Area,
    Automerge,
    Containment,
    Copycat,
    Dispatch,
    EngineSpec,
    Policy,
    Stale,
    Strikes,
    Template,
    Tier,
    TinyPr,
    Winnowing,
)


def _copycat(f: _File, root: _Node) -> Copycat:
    keys = ("containment", "warnings_to_block", "tiny_pr", "boilerplate_max_prs", "winnowing", "strikes")
    m = f.mapping(root, "copycat", keys)
    c = f.mapping(m["containment"], "copycat.containment", ("block", "warn"))
    block = f.fraction(c["block"], "copycat.containment.block")
    warn = f.fraction(c["warn"], "copycat.containment.warn")
    if warn >= block:
        f.fail(
            c["warn"],
            "copycat.containment.warn",
            f"expected a number below containment.block ({block:g}), got {warn:g}",
        )
    tiny = f.mapping(m["tiny_pr"], "copycat.tiny_pr", ("below_added_lines", "warn_literal_overlap"))
    win = f.mapping(m["winnowing"], "copycat.winnowing", ("k", "w"))
    strikes = f.mapping(m["strikes"], "copycat.strikes", ("limit", "window_days"))
    return Copycat(
        containment=Containment(block, warn),
        warnings_to_block=f.integer(m["warnings_to_block"], "copycat.warnings_to_block"),
        tiny_pr=TinyPr(
            f.integer(tiny["below_added_lines"], "copycat.tiny_pr.below_added_lines"),
            f.fraction(tiny["warn_literal_overlap"], "copycat.tiny_pr.warn_literal_overlap"),
        ),
        boilerplate_max_prs=f.integer(m["boilerplate_max_prs"], "copycat.boilerplate_max_prs"),
        winnowing=Winnowing(
            f.integer(win["k"], "copycat.winnowing.k"), f.integer(win["w"], "copycat.winnowing.w")
        ),
        strikes=Strikes(
            f.integer(strikes["limit"], "copycat.strikes.limit"),
            f.integer(strikes["window_days"], "copycat.strikes.window_days"),
        ),
    )


def _policy(f: _File, root: _Node, labels_in_use: dict[str, str]) -> Policy:
    present = {key for key, _, _ in f.items(root, "policy")}
    keys = (
        "open_pr_cap",
        "areas",
        "sensitive_paths",
        "blocklist",
        "stale",
        "template",
        *(("harness_modules",) if "harness_modules" in present else ()),
    )
    m = f.mapping(root, "policy", keys)
    areas = []
    for label, key_node, node in f.items(m["areas"], "policy.areas"):
        field = _join("policy.areas", label)
        f.label(key_node, field)
        if label in labels_in_use:
            f.fail(
                key_node,
                field,
                f"expected a label not used elsewhere, got {label!r} (already {labels_in_use[label]})",
            )
        a = f.mapping(node, field, ("weight", "paths"))
        paths = tuple(
            f.path_pattern(p, _join(f"{field}.paths", i))
            for i, p in enumerate(f.sequence(a["paths"], f"{field}.paths"))
        )
        if not paths:
            f.fail(a["paths"], f"{field}.paths", "expected at least one path, got none")
        areas.append(Area(label, f.fraction(a["weight"], f"{field}.weight"), paths))
    if not areas:
        f.fail(m["areas"], "policy.areas", "expected at least one area, got none")
    total = sum(a.weight for a in areas)
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        f.fail(m["areas"], "policy.areas", f"expected weights summing to 1, got {total:g}")
    sensitive = f.sequence(m["sensitive_paths"], "policy.sensitive_paths")
    logins: list[str] = []
    for i, node in enumerate(f.sequence(m["blocklist"], "policy.blocklist")):
        login = f.text(node, _join("policy.blocklist", i), _LOGIN, "a GitHub login")
        if login.casefold() in (x.casefold() for x in logins):
            f.fail(node, _join("policy.blocklist", i), f"expected each login once, got {login!r} again")
        logins.append(login)
    st = f.mapping(m["stale"], "policy.stale", ("days_without_push", "max_fruitless_verdicts"))
    tp = f.mapping(m["template"], "policy.template", ("require_benchmark", "claim_gap_max"))
    return Policy(
        open_pr_cap=f.integer(m["open_pr_cap"], "policy.open_pr_cap"),
        areas=tuple(areas),
        sensitive_paths=tuple(
            f.path_pattern(p, _join("policy.sensitive_paths", i)) for i, p in enumerate(sensitive)
        ),
        blocklist=tuple(logins),
        harness_modules=tuple(
            f.text(n, _join("policy.harness_modules", i), _MODULE, "a dotted module name such as engine.cli")
            for i, n in enumerate(f.sequence(m["harness_modules"], "policy.harness_modules"))
        )
        if "harness_modules" in m
        else (),
        stale=Stale(
            days_without_push=f.integer(st["days_without_push"], "policy.stale.days_without_push"),
            max_fruitless_verdicts=f.integer(
                st["max_fruitless_verdicts"], "policy.stale.max_fruitless_verdicts", minimum=0
            ),
        ),
        template=Template(
            require_benchmark=f.boolean(tp["require_benchmark"], "policy.template.require_benchmark"),
            # Above 0: a zero tolerance would flag every claim made on a contributor's own machine.
            claim_gap_max=f.number(tp["claim_gap_max"], "policy.template.claim_gap_max", 0, 1, lo_open=True),
        ),
    )


def _automerge(f: _File, root: _Node, tiers: tuple[Tier, ...], known_labels: dict[str, str]) -> Automerge:
    present = {key for key, _, _ in f.items(root, "automerge")}
    optional = [k for k in ("required_ci_workflow", "approval_paths", "approval_label") if k in present]
    m = f.mapping(root, "automerge", ("enabled", "min_tier", "required_labels", "blocking_labels", *optional))
    names = sorted(known_labels)

    def refs(key: str) -> tuple[str, ...]:
        field = f"automerge.{key}"
        return tuple(
            f.choice(n, _join(field, i), names, "a label defined in labels.yaml or policy.yaml")
            for i, n in enumerate(f.sequence(m[key], field))
        )

    required, blocking = refs("required_labels"), refs("blocking_labels")
    for i, name in enumerate(blocking):
        if name in required:
            node = m["blocking_labels"].value[i]
            f.fail(
                node,
                _join("automerge.blocking_labels", i),
                f"expected a label not in required_labels, got {name!r}",
            )
    approval_paths = (
        tuple(
            f.path_pattern(n, _join("automerge.approval_paths", i))
            for i, n in enumerate(f.sequence(m["approval_paths"], "automerge.approval_paths"))
        )
        if "approval_paths" in m
        else ()
    )
    approval_label = (
        f.label(m["approval_label"], "automerge.approval_label") if "approval_label" in m else None
    )
    if approval_paths and approval_label is None:
        f.fail(
            m["approval_paths"],
            "automerge.approval_label",
            "missing; approval_paths needs the label that approves",
        )
    workflow = None
    if "required_ci_workflow" in m:
        workflow = f.text(
            m["required_ci_workflow"],
            "automerge.required_ci_workflow",
            _WORKFLOW_FILE,
            "a workflow file name such as ci.yml",
        )
    return Automerge(
        enabled=f.boolean(m["enabled"], "automerge.enabled"),
        min_tier=f.choice(m["min_tier"], "automerge.min_tier", [t.name for t in tiers], "a tier"),
        required_labels=required,
        blocking_labels=blocking,
        required_ci_workflow=workflow,
        approval_paths=approval_paths,
        approval_label=approval_label,
    )


_OPTIONAL_DISPATCH = ("profile", "workflow", "ref", "timeout_minutes", "max_attempts")


_WORKFLOW_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.ya?ml")


_GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def _dispatch(f: _File, root: _Node, profiles: Sequence[str]) -> Dispatch:
    allowed = ("mode", "runner_public_keys", *_OPTIONAL_DISPATCH)
    present: set[str] = set()
    for key, key_node, _ in f.items(root, "dispatch"):
        if key not in allowed:  # checked here so that a misspelt optional key still gets its hint
            hint = _did_you_mean(key, allowed)
            f.fail(
                key_node, _join("dispatch", key), f"unknown key{hint}; expected one of: {', '.join(allowed)}"
            )
        present.add(key)
    m = f.mapping(root, "dispatch", [k for k in allowed if k not in _OPTIONAL_DISPATCH or k in present])
    extra: dict[str, Any] = {}
    if "profile" in m:
        extra["profile"] = f.choice(m["profile"], "dispatch.profile", profiles, "a profile of profiles.yaml")
    elif Dispatch.profile not in profiles:
        f.fail(root, "dispatch.profile", f"expected the profile PRs are judged on (one of: {', '.join(profiles)}); "
               f"the default, {Dispatch.profile!r}, is not defined")  # fmt: skip
    if "workflow" in m:
        what = "a workflow file name in .github/workflows (e.g. evalbot-eval.yml)"
        extra["workflow"] = f.text(m["workflow"], "dispatch.workflow", _WORKFLOW_FILE, what)
    if "ref" in m:
        extra["ref"] = f.text(m["ref"], "dispatch.ref", _GIT_REF, "a branch or tag name")
    for key in ("timeout_minutes", "max_attempts"):
        if key in m:
            extra[key] = f.integer(m[key], f"dispatch.{key}")
    mode = f.choice(m["mode"], "dispatch.mode", DISPATCH_MODES, "a dispatch mode")
    what = "an Ed25519 public key (base64 of 32 raw bytes)"
    keys = []
    for i, node in enumerate(f.sequence(m["runner_public_keys"], "dispatch.runner_public_keys")):
        field = _join("dispatch.runner_public_keys", i)
        text = f.text(node, field, what=what)
        try:
            raw = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raw = b""
        if len(raw) != 32:
            f.fail(node, field, f"expected {what}, got {text!r}")
        keys.append(text)
    if mode == "actions" and not keys:
        # Results from remote runners are trusted only when signed by a key listed here.
        f.fail(
            m["runner_public_keys"],
            "dispatch.runner_public_keys",
            "expected at least one key when mode is 'actions', got none",
        )
    return Dispatch(mode, tuple(keys), **extra)


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _placeholders(f: _File, node: _Node, field: str, text: str, allowed: Sequence[str]) -> set[str]:
    """The {placeholders} of one template string, each of them one of `allowed`."""
    names = set(_PLACEHOLDER.findall(text))
    for name in sorted(names - set(allowed)):
        f.fail(node, field, f"unknown placeholder {{{name}}}; expected only: "
               f"{', '.join('{' + a + '}' for a in allowed)}")  # fmt: skip
    return names


def _needs(f: _File, node: _Node, field: str, seen: set[str], needs: Sequence[str]) -> None:
    for name in needs:
        if name not in seen:
            f.fail(node, field, f"expected the placeholder {{{name}}}")


def _template(
    f: _File, node: _Node, field: str, allowed: Sequence[str], needs: Sequence[str] = ()
) -> tuple[str, ...]:
    """A list of argv strings whose {placeholders} are all in `allowed`, naming every one of `needs`."""
    items = f.sequence(node, field)
    if not items:
        f.fail(node, field, "expected at least one argument, got an empty list")
    out: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        text = f.text(item, _join(field, i))
        seen |= _placeholders(f, item, _join(field, i), text, allowed)
        out.append(text)
    _needs(f, node, field, seen, needs)
    return tuple(out)


def _some_of(f: _File, node: _Node, field: str, allowed: Sequence[str]) -> dict[str, _Node]:
    """The values of a mapping whose keys are some of `allowed` (an unknown key fails, with the list)."""
    present = [k for k, _, _ in f.items(node, field)]
    for key in present:
        if key not in allowed:
            f.fail(node, f"{field}.{key}", f"unknown key; expected one of: {', '.join(allowed)}")
    return f.mapping(node, field, present)


def _engine(f: _File, root: _Node) -> EngineSpec:
    m = _some_of(f, root, "engine", ("protocol", "build", "serve", "contributor", "reference"))
    for key in ("protocol", "build", "serve", "contributor"):
        if key not in m:
            f.fail(root, f"engine.{key}", "missing; engine.yaml needs protocol, build, serve and contributor")
    build = _some_of(f, m["build"], "engine.build", ("package", "project", "commands", "toolchain"))
    if not {"package", "commands"} & set(build):
        f.fail(m["build"], "engine.build", "expected a package to install, build commands, or both")
    commands = (
        tuple(
            _template(f, node, _join("engine.build.commands", i), BUILD_FIELDS)
            for i, node in enumerate(f.sequence(build["commands"], "engine.build.commands"))
        )
        if "commands" in build
        else ()
    )
    toolchain = []
    for i, node in enumerate(
        f.sequence(build["toolchain"], "engine.build.toolchain") if "toolchain" in build else []
    ):
        path = f.text(node, _join("engine.build.toolchain", i), what="an absolute path")
        if not path.startswith("/") or "/../" in f"{path}/" or path.rstrip("/") in ("", "/home", "/root"):
            f.fail(
                node,
                _join("engine.build.toolchain", i),
                f"expected an absolute path of a toolchain, got {path!r}",
            )
        toolchain.append(path)
    # random_weights is optional: an engine that only loads model files (llama-server) leaves it out
    serve = _some_of(f, m["serve"], "engine.serve", ("argv", "model_file", "random_weights", "draft"))
    for key in ("argv", "model_file"):
        if key not in serve:
            f.fail(m["serve"], f"engine.serve.{key}", "missing; a serving engine needs argv and model_file")
    contributor = f.mapping(m["contributor"], "engine.contributor", ("bench",))
    node = contributor["bench"]
    bench = f.text(node, "engine.contributor.bench")
    seen = _placeholders(f, node, "engine.contributor.bench", bench, ("model_args", "ctx", "runs"))
    _needs(f, node, "engine.contributor.bench", seen, ("ctx",))
    protocol = f.choice(m["protocol"], "engine.protocol", PROTOCOLS, "a protocol evalbot speaks")
    argv = _template(f, serve["argv"], "engine.serve.argv", SERVE_FIELDS)
    if protocol in HTTP_PROTOCOLS and not any("{port}" in a for a in argv):
        f.fail(
            serve["argv"],
            "engine.serve.argv",
            f"a {protocol} engine must listen on {{port}}: name it in the argv",
        )
    return EngineSpec(
        protocol=protocol,
        package=f.text(build["package"], "engine.build.package", _PACKAGE, "a Python package name")
        if "package" in build
        else None,
        argv=argv,
        model_file=_template(f, serve["model_file"], "engine.serve.model_file", ("model",), ("model",)),
        random_weights=_template(
            f, serve["random_weights"], "engine.serve.random_weights", ("shape",), ("shape",)
        )
        if "random_weights" in serve
        else (),
        # optional: how a serving engine is given a draft model (a speculative track's drafter 'draft')
        draft_args=_template(f, serve["draft"], "engine.serve.draft", ("draft",), ("draft",))
        if "draft" in serve
        else (),
        bench=bench,
        commands=commands,
        toolchain=tuple(toolchain),
        reference=_reference(f, m, build),
        project=_project(f, build),
    )


def _project(f: _File, build: dict[str, _Node]) -> str:
    """engine.build.project: the folder of the tree whose pyproject.toml installs the package (default: the
    tree's root), a relative path that stays inside the tree."""
    if "project" not in build:
        return "."
    if "package" not in build:
        f.fail(
            build["project"],
            "engine.build.project",
            "names where the package's project is: name the package too",
        )
    path = f.text(build["project"], "engine.build.project", what="a folder of the tree")
    parts = path.strip("/").split("/")
    if path.startswith("/") or ".." in parts or not path.strip("/"):
        f.fail(
            build["project"],
            "engine.build.project",
            f"expected a relative folder inside the tree, got {path!r}",
        )
    return "/".join(p for p in parts if p not in ("", ".")) or "."


def _reference(f: _File, m: dict[str, _Node], build: dict[str, _Node]) -> str:
    """engine.yaml's `reference`: evalbot's own (the default), or main's, which needs main's build package."""
    if "reference" not in m:
        return "evalbot"
    who = f.choice(m["reference"], "engine.reference", REFERENCES, "who provides the reference tools")
    if who == "main" and "package" not in build:
        f.fail(
            m["reference"],
            "engine.reference",
            "main's reference tools are its build package's modules (<package>.reference, .compare, "
            ".registry): name the package in engine.build.package, or use evalbot's",
        )
    return who
