"""evalbot.receipts: canonical JSON, receipt bodies, Ed25519 sign/verify, key loading, receipt files."""

from __future__ import annotations

import base64
import copy
import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from evalbot import receipts as r

HEAD, BASE, HARNESS = "a" * 40, "b" * 40, "c" * 40
RULES_HASH, MODEL_SHA = "d" * 64, "e" * 64
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def _body(**overrides):
    fields = dict(
        pr=42,
        head_sha=HEAD,
        base_sha=BASE,
        harness_sha=HARNESS,
        rules_hash=RULES_HASH,
        model_sha256s={"target": MODEL_SHA},
        engine_build={"head": {"wheel_sha256": "1" * 64}, "base": {"wheel_sha256": "2" * 64}},
        box={"gpu": "NVIDIA H200", "driver": "570.86", "clocks_mhz": [1980, 1980], "temp_c": None},
        measurements={
            "unit": "ms",
            "pairs": [{"base_ms": 10.5, "head_ms": 9.25}, {"base_ms": 10.25, "head_ms": math.pi}],
        },
        verdict={"tier": "gain-2", "lower_bound_gain": 0.031},
        started_at=T0,
        finished_at=T0 + timedelta(minutes=7),
        extra={"note": "Grüße ✓"},
    )
    fields.update(overrides)
    return r.build_receipt(**fields)


@pytest.fixture(scope="module")
def key():
    return r.generate_key()


@pytest.fixture
def signed(key):
    return r.sign(_body(), key)


def _tweak(value):
    """A different value of the same JSON shape."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if isinstance(value, dict):
        return {**value, "injected": 1}
    if isinstance(value, list):
        return [*value, 1]
    raise AssertionError(type(value))


# ---------------------------------------------------------------- sign / verify


def test_sign_then_verify(key, signed):
    result = r.verify(signed, key.public_key())
    assert result == r.VerifyResult(True, "verified", r.default_key_id(key.public_key()))
    assert result and len(result.key_id) == 16
    assert signed["signature"]["alg"] == "ed25519"
    assert len(base64.b64decode(signed["signature"]["public_key"])) == 32
    assert r.signature_status(signed) == f"signed by {result.key_id}"


def test_custom_key_id_and_public_key_as_bytes(key):
    receipt = r.sign(_body(), key, key_id="prod-2025")
    assert r.signature_status(receipt) == "signed by prod-2025"
    for public in (r.public_key_pem(key.public_key()), receipt["signature"]["public_key"].encode()):
        assert r.verify(receipt, public) == r.VerifyResult(True, "verified", "prod-2025")


def test_sign_keeps_its_own_copy_of_the_body(key):
    body = _body()
    receipt = r.sign(body, key)
    body["measurements"]["pairs"][0]["head_ms"] = 1.0
    assert r.verify(receipt, key.public_key()).ok


@pytest.mark.parametrize("field", sorted(_body()))
def test_tampering_with_any_top_level_field_fails(key, signed, field):
    signed["body"][field] = _tweak(signed["body"][field])
    result = r.verify(signed, key.public_key())
    assert not result.ok and result.reason == "signature does not match the body (tampered)"


def test_every_field_of_the_issue_is_in_the_body():
    assert set(_body()) == {
        "schema", "pr", "head_sha", "base_sha", "harness_sha", "rules_hash", "model_sha256s",
        "engine_build", "box", "measurements", "verdict", "started_at", "finished_at", "extra",
    }  # fmt: skip


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b["measurements"]["pairs"][1].update(head_ms=9.5),
        lambda b: b["measurements"]["pairs"].reverse(),
        lambda b: b["box"].update(temp_c=0),  # null -> 0
        lambda b: b.pop("extra"),
        lambda b: b.update(pr=42.0),  # same number, different JSON text
    ],
    ids=["nested-value", "list-order", "null-to-zero", "dropped-key", "int-to-float"],
)
def test_tampering_with_nested_values_fails(key, signed, edit):
    edit(signed["body"])
    assert not r.verify(signed, key.public_key()).ok


def test_float_changed_in_its_last_digit_fails(key, signed, tmp_path):
    path = tmp_path / "receipt.json"
    r.dump(signed, path)
    old = repr(math.pi)
    new = old[:-1] + "4"  # 3.141592653589794: the next double up, one ulp away
    assert float(new) != float(old)
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1
    path.write_text(text.replace(old, new), encoding="utf-8")
    assert not r.verify(r.load(path), key.public_key()).ok


def test_key_order_does_not_matter(key, signed):
    def reorder(value):
        if isinstance(value, dict):
            return {k: reorder(value[k]) for k in reversed(list(value))}
        if isinstance(value, list):
            return [reorder(v) for v in value]
        return value

    shuffled = reorder(signed)
    assert list(shuffled["body"]) != list(signed["body"])
    assert r.verify(shuffled, key.public_key()).ok


def test_file_round_trip_and_whitespace_reformatting_do_not_matter(key, signed, tmp_path):
    path = tmp_path / "receipt.json"
    r.dump(signed, path)
    assert r.load(path) == signed and r.verify(r.load(path), key.public_key()).ok
    compact = json.dumps(r.load(path), separators=(",", ":"), ensure_ascii=True)
    path.write_text(compact, encoding="utf-8")
    assert r.verify(r.load(path), key.public_key()).ok
    path.write_text(json.dumps(json.loads(compact), indent="\t") + "\n\n", encoding="utf-8")
    assert r.verify(r.load(path), key.public_key()).ok


def test_another_key_fails(signed):
    other = r.generate_key()
    result = r.verify(signed, other.public_key())
    assert not result.ok and result.reason == "signed by a different key"


def test_trust_comes_from_the_verifiers_key_not_the_embedded_one(key):
    forger = r.generate_key()
    forged = r.sign(_body(), forger)
    assert not r.verify(forged, key.public_key()).ok  # embedded key is the forger's
    # Claiming the real public key does not help: the signature is still the forger's.
    forged["signature"]["public_key"] = base64.b64encode(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ).decode()
    result = r.verify(forged, key.public_key())
    assert not result.ok and "tampered" in result.reason


def test_unsigned_fails_with_unsigned(key):
    receipt = r.unsigned(_body())
    assert receipt["signature"] is None
    assert r.verify(receipt, key.public_key()) == r.VerifyResult(False, "unsigned", None)
    assert r.signature_status(receipt) == "unsigned"


def _drop(field):
    return lambda rc: rc["signature"].pop(field)


def _set(field, value):
    return lambda rc: rc["signature"].update({field: value})


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda rc: rc.pop("signature"), "receipt has no signature field"),
        (lambda rc: rc.pop("body"), "receipt has no body"),
        (lambda rc: rc.update(signature="abc"), "signature is a str, not an object"),
        (lambda rc: rc.update(body=[1]), "body is a list, not an object"),
        (lambda rc: rc["body"].update(x=math.nan), "body.x: nan is not allowed"),
        (lambda rc: rc["body"].update(x={1, 2}), "body.x: set is not a JSON type"),
        *[(_drop(f), f"signature is missing field(s): {f}") for f in r.SIGNATURE_FIELDS],
        (_set("key_id", ""), "signature key_id is not a non-empty string"),
        (_set("key_id", 7), "signature key_id is not a non-empty string"),
        (_set("alg", "rsa"), "unsupported signature alg 'rsa'"),
        (_set("value", "not base64!"), "signature value is not valid base64"),
        (_set("value", "QUJD"), "signature value is 3 bytes; an Ed25519 signature is 64"),
        (_set("value", None), "signature value is a NoneType, not a base64 string"),
        (_set("public_key", "é"), "signature public_key is not valid base64"),
        (_set("public_key", "QUJD"), "signed by a different key"),
    ],
)
def test_malformed_receipts_fail_with_a_reason(key, signed, edit, reason):
    edit(signed)
    result = r.verify(signed, key.public_key())
    assert not result.ok and result.reason.startswith(reason), result.reason


@pytest.mark.parametrize("receipt", [None, [], "receipt"])
def test_a_receipt_that_is_not_an_object_fails(key, receipt):
    assert r.verify(receipt, key.public_key()).reason.endswith("not a JSON object")
    assert r.signature_status(receipt) == "malformed receipt"


def test_signature_status_of_malformed_signatures():
    assert r.signature_status({"body": {}}) == "malformed signature"
    assert r.signature_status({"body": {}, "signature": {"value": "x"}}) == "malformed signature"


def test_a_bad_verifier_key_raises_rather_than_blaming_the_receipt(signed):
    with pytest.raises(r.ReceiptError):
        r.verify(signed, b"short")
    with pytest.raises(TypeError):
        r.verify(signed, r.generate_key())  # a private key is a programming error


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_is_sorted_compact_utf8():
    value = {"b": [1, 2.5, (3, "é")], "a": {"z": None, "y": True}, "ü": -0.0}
    assert r.canonical_json(value) == '{"a":{"y":true,"z":null},"b":[1,2.5,[3,"é"]],"ü":-0.0}'.encode()


@pytest.mark.parametrize("x", [0.1, 0.30000000000000004, 1e-300, 1.7976931348623157e308, 1e22, 2.0, 5e-324])
def test_canonical_floats_round_trip(x):
    text = r.canonical_json([x])
    assert text == f"[{x!r}]".encode() and json.loads(text)[0] == x


@pytest.mark.parametrize(
    "value, message",
    [
        (math.nan, "nan is not allowed"),
        ({"a": [math.inf]}, r"value\.a\[0\]: inf is not allowed"),
        ({"a": {1, 2}}, "value.a: set is not a JSON type"),
        ({"a": b"x"}, "value.a: bytes is not a JSON type"),
        ({"a": object()}, "value.a: object is not a JSON type"),
        ({"a": T0}, "value.a: datetime is not a JSON type"),
        ({1: "x"}, "object key 1 is int, not str"),
        ({"a": "\ud800"}, "value.a: string is not valid Unicode"),
    ],
)
def test_canonical_json_rejects_non_json(value, message):
    with pytest.raises(r.ReceiptError, match=message):
        r.canonical_json(value)


# ---------------------------------------------------------------- receipt bodies


def test_build_receipt_normalizes():
    body = _body(
        measurements=({"ms": 1.5},),
        started_at="2025-03-01T13:00:00+01:00",
        finished_at=datetime(2025, 3, 1, 12, 1, tzinfo=timezone(timedelta(hours=-2))),
        extra=None,
    )
    assert body["schema"] == "evalbot.receipt/1"
    assert body["measurements"] == [{"ms": 1.5}]
    assert body["started_at"] == "2025-03-01T12:00:00Z" and body["finished_at"] == "2025-03-01T14:01:00Z"
    assert "extra" not in body


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"pr": 0}, "pr must be a positive int"),
        ({"pr": True}, "pr must be a positive int"),
        ({"head_sha": "A" * 40}, "head_sha must be a 40-character git sha"),
        ({"base_sha": "b" * 39}, "base_sha must be a 40-character git sha"),
        ({"harness_sha": None}, "harness_sha must be a 40-character git sha"),
        ({"rules_hash": "d" * 40}, "rules_hash must be a 64-character sha256"),
        ({"model_sha256s": {}}, "model_sha256s is empty"),
        ({"model_sha256s": ["e" * 64]}, "model_sha256s must be a mapping"),
        ({"model_sha256s": {"draft": "xyz"}}, r"model_sha256s\['draft'\] must be a 64-character sha256"),
        ({"box": "H200"}, "box must be a mapping"),
        ({"verdict": None}, "verdict must be a mapping or a string"),
        ({"started_at": datetime(2025, 1, 1)}, "started_at must carry a timezone"),
        ({"finished_at": "yesterday"}, "finished_at is not an ISO-8601 timestamp"),
        ({"finished_at": T0 - timedelta(seconds=1)}, "finished_at .* is before started_at"),
        ({"box": {"gpus": {"H200"}}}, r"body.box.gpus: set is not a JSON type"),
        ({"measurements": {"ms": math.nan}}, r"body.measurements.ms: nan is not allowed"),
    ],
)
def test_build_receipt_rejects_bad_fields(overrides, message):
    with pytest.raises(r.ReceiptError, match=message):
        _body(**overrides)


# ---------------------------------------------------------------- keys


def _raw(key):
    if isinstance(key, Ed25519PrivateKey):
        return key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@pytest.mark.parametrize("form", ["pem", "raw", "base64", "base64-str-newline"])
def test_key_round_trips(key, form):
    public = key.public_key()
    encode = {
        "pem": lambda k: r.private_key_pem(k) if k is key else r.public_key_pem(k),
        "raw": _raw,
        "base64": lambda k: base64.b64encode(_raw(k)),
        "base64-str-newline": lambda k: base64.b64encode(_raw(k)).decode() + "\n",
    }[form]
    assert _raw(r.load_private_key(encode(key))) == _raw(key)
    assert _raw(r.load_public_key(encode(public))) == _raw(public)


def test_pem_forms():
    key = r.generate_key()
    assert r.private_key_pem(key).startswith(b"-----BEGIN PRIVATE KEY-----")
    assert r.public_key_pem(key.public_key()).startswith(b"-----BEGIN PUBLIC KEY-----")


@pytest.mark.parametrize(
    "loader, data, message",
    [
        (r.load_private_key, b"x" * 31, "neither PEM, 32 raw bytes nor base64"),
        (r.load_public_key, base64.b64encode(b"x" * 31), "base64 of 31 bytes"),
        (r.load_public_key, "ключ", "not ASCII"),
        (
            r.load_private_key,
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            "cannot be read",
        ),
        (r.load_public_key, r.private_key_pem(r.generate_key()), "is a private key"),
    ],
)
def test_key_loading_errors(loader, data, message):
    with pytest.raises(r.ReceiptError, match=message):
        loader(data)


def test_non_ed25519_and_encrypted_pems_are_refused():
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_pem = ec_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(r.ReceiptError, match="not an Ed25519 key"):
        r.load_private_key(ec_pem)
    ec_public = ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(r.ReceiptError, match="not an Ed25519 key"):
        r.load_public_key(ec_public)
    encrypted = r.generate_key().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(r.ReceiptError, match="encrypted"):
        r.load_private_key(encrypted)


# ---------------------------------------------------------------- files


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"body": {}, ', r"receipt.json:1:\d+: malformed JSON"),
        ('{"body": {"x": NaN}, "signature": null}', "NaN is not valid JSON"),
        ('{"body": {}, "signature": null, "body": {}}', "duplicate key 'body'"),
        ("[1, 2]", "receipt is a JSON list, not an object"),
    ],
)
def test_load_rejects_malformed_files(tmp_path, text, message):
    path = tmp_path / "receipt.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(r.ReceiptError, match=message):
        r.load(path)


def test_load_missing_or_non_utf8_file(tmp_path):
    with pytest.raises(r.ReceiptError, match="cannot read receipt"):
        r.load(tmp_path / "absent.json")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(r.ReceiptError, match="not UTF-8"):
        r.load(tmp_path / "latin1.json")


def test_dump_writes_readable_utf8_and_leaves_no_temp_file(signed, tmp_path):
    path = tmp_path / "receipt.json"
    r.dump(signed, path)
    assert "Grüße ✓" in path.read_text(encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["receipt.json"]
    with pytest.raises(r.ReceiptError):
        r.dump(copy.deepcopy(signed) | {"body": {"x": math.nan}}, path)
    assert r.load(path) == signed
