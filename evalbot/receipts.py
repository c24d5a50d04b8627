"""Signed evaluation receipts: an Ed25519 signature over the canonical JSON of a receipt body.

A receipt is ``{"body": {...}, "signature": {...} | None}``. The signature covers exactly
``canonical_json(body)``; the body's ``schema`` field ("evalbot.receipt/1") names what was signed,
so a receipt signature cannot be passed off as a signature over some other kind of document.

Canonical JSON here: object keys sorted by code point, separators ``,`` and ``:`` with no other
whitespace, non-ASCII text left unescaped (``ensure_ascii=False``) and encoded as UTF-8, floats
as Python's shortest round-trip ``repr``, NaN and Infinity rejected, tuples written as lists, and
anything that is not a JSON type (sets, bytes, other objects, non-string keys) rejected.

Nothing here reads the environment or a default path: keys come in as objects or bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SCHEMA = "evalbot.receipt/1"
ALG = "ed25519"
SIGNATURE_FIELDS = ("alg", "key_id", "public_key", "value")

_GIT_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ReceiptError(ValueError):
    """A receipt, its body or a key is malformed; the message says what and where."""


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verify(): ok, a human reason, and the key_id the receipt claims (if any)."""

    ok: bool
    reason: str
    key_id: str | None = None

    # `if verify(...):` must mean "verified"; a plain dataclass is always truthy.
    def __bool__(self) -> bool:
        return self.ok


# ---------------------------------------------------------------- canonical JSON


def _plain(value: Any, where: str) -> Any:
    """A deep copy of value made of plain dict/list/str/int/float/bool/None, or ReceiptError."""
    # bool before int: bool is an int subclass, and must stay true/false.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # drop subclasses such as IntEnum: the copy is plain data
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ReceiptError(f"{where}: {value!r} is not allowed in JSON")
        return float(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ReceiptError(f"{where}: string is not valid Unicode (lone surrogate)") from None
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                # json.dumps would coerce 1 -> "1" and let {1: a, "1": b} collide.
                raise ReceiptError(f"{where}: object key {key!r} is {type(key).__name__}, not str")
            out[_plain(key, f"{where} key")] = _plain(item, f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise ReceiptError(f"{where}: {type(value).__name__} is not a JSON type")


def to_json_data(value: Any, where: str = "value") -> Any:
    """value as plain JSON data (tuples become lists); ReceiptError naming the path of anything else."""
    try:
        return _plain(value, where)
    except RecursionError:
        raise ReceiptError(f"{where}: nested too deeply") from None


def canonical_json(value: Any, where: str = "value") -> bytes:
    """The canonical UTF-8 JSON bytes of value (see the module docstring); ReceiptError if not JSON."""
    data = to_json_data(value, where)
    try:
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError) as e:  # e.g. an int past Python's digit limit
        raise ReceiptError(f"{where} cannot be written as JSON: {e}") from None
    return text.encode("utf-8")


# ---------------------------------------------------------------- receipt bodies


def _check_hex(name: str, value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ReceiptError(f"{name} must be {what} (lowercase hex), got {value!r}")
    return value


def _timestamp(name: str, value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ReceiptError(f"{name} is not an ISO-8601 timestamp: {value!r}") from None
    if not isinstance(value, datetime):
        raise ReceiptError(f"{name} must be a datetime or ISO-8601 string, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        # A naive time means a different instant on every box; receipts are compared across boxes.
        raise ReceiptError(f"{name} must carry a timezone, got naive {value.isoformat()}")
    return value.astimezone(UTC)


def _utc_text(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _require(name: str, value: Any, types: type | tuple[type, ...], what: str) -> None:
    if not isinstance(value, types):
        raise ReceiptError(f"{name} must be {what}, got {type(value).__name__}")


def build_receipt(
    *,
    pr: int | None,
    head_sha: str,
    base_sha: str,
    harness_sha: str,
    rules_hash: str,
    model_sha256s: Mapping[str, str],
    engine_build: Mapping[str, Any],
    box: Mapping[str, Any],
    measurements: Mapping[str, Any] | list[Any] | tuple[Any, ...],
    verdict: Mapping[str, Any] | str,
    started_at: datetime | str,
    finished_at: datetime | str,
    extra: Mapping[str, Any] | None = None,
    reference: Mapping[str, Any] | None = None,
    measured_sha: str | None = None,
) -> dict[str, Any]:
    """A validated receipt body as plain JSON data, with ``schema`` set; ReceiptError on a bad field.

    model_sha256s maps a model's role or name to its sha256; timestamps must be timezone-aware and are stored in UTC.
    """
    # None: an offline evaluation of two revisions, not tied to a pull request
    if pr is not None and (isinstance(pr, bool) or not isinstance(pr, int) or pr <= 0):
        raise ReceiptError(f"pr must be a positive int or None, got {pr!r}")
    for name, sha in (
        ("head_sha", head_sha),
        ("base_sha", base_sha),
        ("harness_sha", harness_sha),
        *((("measured_sha", measured_sha),) if measured_sha is not None else ()),
    ):
        _check_hex(name, sha, _GIT_SHA, "a 40-character git sha")
    _check_hex("rules_hash", rules_hash, _SHA256, "a 64-character sha256")
    _require("model_sha256s", model_sha256s, Mapping, "a mapping of model name to sha256")
    if not model_sha256s:
        raise ReceiptError("model_sha256s is empty: a receipt must name the models it measured")
    for model, sha in model_sha256s.items():
        _check_hex(f"model_sha256s[{model!r}]", sha, _SHA256, "a 64-character sha256")
    _require("engine_build", engine_build, Mapping, "a mapping")
    _require("box", box, Mapping, "a mapping")
    _require("measurements", measurements, (Mapping, list, tuple), "a mapping or a list")
    _require("verdict", verdict, (Mapping, str), "a mapping or a string")
    start, finish = _timestamp("started_at", started_at), _timestamp("finished_at", finished_at)
    if finish < start:
        raise ReceiptError(f"finished_at {_utc_text(finish)} is before started_at {_utc_text(start)}")
    if extra is not None:
        _require("extra", extra, Mapping, "a mapping or None")
    if reference is not None:
        _require("reference", reference, Mapping, "a mapping of model name to the reference's identity")

    body: dict[str, Any] = {
        "schema": SCHEMA,
        "pr": pr,
        "head_sha": head_sha,
        "base_sha": base_sha,
        **({"measured_sha": measured_sha} if measured_sha is not None else {}),
        "harness_sha": harness_sha,
        "rules_hash": rules_hash,
        "model_sha256s": model_sha256s,
        "engine_build": engine_build,
        "box": box,
        "measurements": measurements,
        "verdict": verdict,
        "started_at": _utc_text(start),
        "finished_at": _utc_text(finish),
    }
    if reference:
        body["reference"] = reference  # llama.cpp's version, build flags and library sha256, per model
    if extra is not None:
        body["extra"] = extra
    return to_json_data(body, "body")


# ---------------------------------------------------------------- keys


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict standard base64; binascii.Error on anything else."""
    return base64.b64decode(text.encode("ascii"), validate=True)


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def default_key_id(public_key: Ed25519PublicKey) -> str:
    """The default key id: the first 16 hex digits of sha256 of the raw 32-byte public key."""
    return hashlib.sha256(_raw_public(public_key)).hexdigest()[:16]


def generate_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def _as_bytes(data: bytes | str, what: str) -> bytes:
    # Keys often arrive as str (an env var read by the CLI); accept both.
    if isinstance(data, str):
        try:
            return data.encode("ascii")
        except UnicodeEncodeError:
            raise ReceiptError(f"{what} text is not ASCII, so neither PEM nor base64") from None
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, got {type(data).__name__}")


def _raw_key_bytes(data: bytes, what: str) -> bytes:
    """32 raw key bytes from raw or base64 input; ReceiptError otherwise."""
    if len(data) == 32:  # checked before stripping: raw bytes may begin or end with whitespace bytes
        return data
    text = data.strip()
    try:
        raw = _b64decode(text.decode("ascii"))
    except (UnicodeDecodeError, binascii.Error, ValueError):
        raise ReceiptError(
            f"{what} is neither PEM, 32 raw bytes nor base64 of 32 raw bytes ({len(data)} bytes given)"
        ) from None
    if len(raw) != 32:
        raise ReceiptError(f"{what} is base64 of {len(raw)} bytes; an Ed25519 key is 32 bytes")
    return raw


def _is_pem(data: bytes) -> bool:
    return data.lstrip().startswith(b"-----BEGIN ")


def load_private_key(data: bytes | str) -> Ed25519PrivateKey:
    """An Ed25519 private key from unencrypted PKCS8 PEM, 32 raw bytes, or base64 of them."""
    data = _as_bytes(data, "private key")
    if _is_pem(data):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:  # cryptography's signal for an encrypted key given no password
            raise ReceiptError("private key PEM is encrypted; give an unencrypted PKCS8 key") from None
        except (ValueError, binascii.Error, UnsupportedAlgorithm) as e:
            raise ReceiptError(f"private key PEM cannot be read: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ReceiptError(f"private key PEM holds a {type(key).__name__}, not an Ed25519 key")
        return key
    return Ed25519PrivateKey.from_private_bytes(_raw_key_bytes(data, "private key"))


def load_public_key(data: bytes | str) -> Ed25519PublicKey:
    """An Ed25519 public key from SubjectPublicKeyInfo PEM, 32 raw bytes, or base64 of them."""
    data = _as_bytes(data, "public key")
    if _is_pem(data):
        if b"PRIVATE KEY-----" in data:
            # Refuse rather than derive: a private key in the verifier's hands is a leak to report.
            raise ReceiptError("public key PEM is a private key; give the public key")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, binascii.Error, UnsupportedAlgorithm) as e:
            raise ReceiptError(f"public key PEM cannot be read: {e}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ReceiptError(f"public key PEM holds a {type(key).__name__}, not an Ed25519 key")
        return key
    raw = _raw_key_bytes(data, "public key")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as e:  # OpenSSL may refuse some 32-byte strings
        raise ReceiptError(f"public key bytes are not an Ed25519 key: {e}") from None


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """key as unencrypted PKCS8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    """key as SubjectPublicKeyInfo PEM."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


# ---------------------------------------------------------------- sign, verify


def sign(
    body: Mapping[str, Any], private_key: Ed25519PrivateKey, key_id: str | None = None
) -> dict[str, Any]:
    """A signed receipt over canonical_json(body); key_id defaults to default_key_id(public key)."""
    if not isinstance(private_key, Ed25519PrivateKey):
        raise TypeError(f"private_key must be an Ed25519PrivateKey, got {type(private_key).__name__}")
    if not isinstance(body, Mapping):
        raise ReceiptError(f"body must be a mapping, got {type(body).__name__}")
    if key_id is not None and (not isinstance(key_id, str) or not key_id):
        raise ReceiptError(f"key_id must be a non-empty string, got {key_id!r}")
    # Keep a plain copy, so the caller mutating its dict later cannot silently break the signature.
    plain = to_json_data(body, "body")
    public = private_key.public_key()
    signature = private_key.sign(canonical_json(plain))
    return {
        "body": plain,
        "signature": {
            "alg": ALG,
            "key_id": key_id if key_id is not None else default_key_id(public),
            "public_key": _b64encode(_raw_public(public)),
            "value": _b64encode(signature),
        },
    }


def unsigned(body: Mapping[str, Any]) -> dict[str, Any]:
    """A receipt with an explicit null signature, for runs with no signing key configured."""
    if not isinstance(body, Mapping):
        raise ReceiptError(f"body must be a mapping, got {type(body).__name__}")
    return {"body": to_json_data(body, "body"), "signature": None}


def signature_status(receipt: Mapping[str, Any]) -> str:
    """What the receipt claims, not verified: "unsigned", "signed by <key_id>", or "malformed ..."."""
    if not isinstance(receipt, Mapping):
        return "malformed receipt"
    signature = receipt.get("signature", ...)  # an absent field is malformed, not unsigned
    if signature is None:
        return "unsigned"
    if isinstance(signature, Mapping) and isinstance(signature.get("key_id"), str) and signature["key_id"]:
        return f"signed by {signature['key_id']}"
    return "malformed signature"


def verify(receipt: Mapping[str, Any], public_key: Ed25519PublicKey | bytes | str) -> VerifyResult:
    """Whether receipt's body was signed by public_key; a malformed receipt gives ok=False with a reason.

    A bad public_key (the verifier's own input) raises ReceiptError or TypeError instead.
    """
    if not isinstance(public_key, Ed25519PublicKey):
        if not isinstance(public_key, bytes | bytearray | memoryview | str):
            raise TypeError(
                f"public_key must be an Ed25519PublicKey or bytes, got {type(public_key).__name__}"
            )
        public_key = load_public_key(public_key)

    if not isinstance(receipt, Mapping):
        return VerifyResult(False, f"receipt is a {type(receipt).__name__}, not a JSON object")
    if "body" not in receipt:
        return VerifyResult(False, "receipt has no body")
    if "signature" not in receipt:
        return VerifyResult(False, "receipt has no signature field")
    signature = receipt["signature"]
    if signature is None:
        return VerifyResult(False, "unsigned")
    if not isinstance(signature, Mapping):
        return VerifyResult(False, f"signature is a {type(signature).__name__}, not an object")
    missing = [f for f in SIGNATURE_FIELDS if f not in signature]
    if missing:
        return VerifyResult(False, f"signature is missing field(s): {', '.join(missing)}")
    claimed_id = signature["key_id"] if isinstance(signature["key_id"], str) else None
    if not claimed_id:
        return VerifyResult(False, "signature key_id is not a non-empty string")

    def fail(reason: str) -> VerifyResult:
        return VerifyResult(False, reason, claimed_id)

    if signature["alg"] != ALG:
        return fail(f"unsupported signature alg {signature['alg']!r}; expected {ALG!r}")
    decoded = {}
    for field in ("public_key", "value"):
        if not isinstance(signature[field], str):
            return fail(f"signature {field} is a {type(signature[field]).__name__}, not a base64 string")
        try:
            decoded[field] = _b64decode(signature[field])
        except (binascii.Error, ValueError):
            return fail(f"signature {field} is not valid base64")
    if len(decoded["value"]) != 64:
        return fail(f"signature value is {len(decoded['value'])} bytes; an Ed25519 signature is 64")

    # The embedded public key is informational only (it is not covered by the signature, so anyone
    # can rewrite it): trust comes from the key the verifier passed in. A mismatch still fails, with
    # a clearer reason than "bad signature", and because the receipt was altered or misattributed.
    if decoded["public_key"] != _raw_public(public_key):
        return fail("signed by a different key")
    body = receipt["body"]
    if not isinstance(body, Mapping):
        return fail(f"body is a {type(body).__name__}, not an object")
    try:
        message = canonical_json(body, "body")
    except ReceiptError as e:
        return fail(str(e))
    try:
        public_key.verify(decoded["value"], message)
    except InvalidSignature:
        return fail("signature does not match the body (tampered)")
    return VerifyResult(True, "verified", claimed_id)


# ---------------------------------------------------------------- files


def dump(receipt: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write receipt to path as indented, key-sorted UTF-8 JSON, atomically (temp file + rename)."""
    if not isinstance(receipt, Mapping):
        raise ReceiptError(f"receipt must be a mapping, got {type(receipt).__name__}")
    data = to_json_data(receipt, "receipt")
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    path = Path(path)
    # A half-written receipt would read as "tampered"; write aside, then rename over.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _reject_constant(name: str) -> Any:
    raise ReceiptError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys let two JSON readers see two different receipts; refuse them.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ReceiptError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a receipt JSON file; ReceiptError naming the file on unreadable, malformed or non-object JSON."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ReceiptError(f"{path}: cannot read receipt: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReceiptError(f"{path}: receipt is not UTF-8 (byte {e.start})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ReceiptError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None
    except ReceiptError as e:
        raise ReceiptError(f"{path}: {e}") from None
    except RecursionError:
        raise ReceiptError(f"{path}: receipt JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise ReceiptError(f"{path}: receipt is a JSON {type(data).__name__}, not an object")
    return data
