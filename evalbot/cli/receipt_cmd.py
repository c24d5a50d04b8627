"""`evalbot receipt sign|verify`: Ed25519 receipts. Keys come from a path or an environment variable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from evalbot import receipts
from evalbot.cli.options import EXISTING_FILE, file_option

SIGNING_KEY_ENV = "EVALBOT_SIGNING_KEY"  # a private key (PEM or base64 raw), for runners without a key file
VERIFY_KEY_ENV = "EVALBOT_VERIFY_KEY"


def _key_bytes(path: Path | None, env_name: str, what: str) -> bytes | None:
    if path is not None:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise click.ClickException(f"cannot read the {what} key {path}: {exc}") from exc
    value = os.environ.get(env_name)
    return value.encode() if value else None


@click.group()
def receipt() -> None:
    """Sign and verify evaluation receipts."""


@receipt.command()
@click.argument("body_file", type=EXISTING_FILE)
@file_option("--key", "key_path", f"private key file (PEM or base64 raw); default: ${SIGNING_KEY_ENV}")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="where to write (default: stdout)"
)
def sign(body_file: Path, key_path: Path | None, out: Path | None) -> None:
    """Sign a receipt body (or re-sign a receipt's body). Without a key the receipt says 'unsigned'."""
    try:
        data = receipts.load(body_file)
        body = data["body"] if "body" in data and "signature" in data else data
        raw = _key_bytes(key_path, SIGNING_KEY_ENV, "signing")
        signed = receipts.sign(body, receipts.load_private_key(raw)) if raw else receipts.unsigned(body)
    except receipts.ReceiptError as exc:
        raise click.ClickException(str(exc)) from exc
    if out:
        receipts.dump(signed, out)
    else:
        import json

        json.dump(signed, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
        sys.stdout.write("\n")
    click.echo(receipts.signature_status(signed), err=True)


@receipt.command()
@click.argument("receipt_file", type=EXISTING_FILE)
@file_option("--key", "key_path", f"the signer's public key (PEM or base64 raw); default: ${VERIFY_KEY_ENV}")
def verify(receipt_file: Path, key_path: Path | None) -> None:
    """Check a receipt's signature against the given public key; exit 1 if it does not verify."""
    raw = _key_bytes(key_path, VERIFY_KEY_ENV, "public")
    if raw is None:
        raise click.ClickException(f"no public key: pass --key PATH or set ${VERIFY_KEY_ENV}")
    try:
        result = receipts.verify(receipts.load(receipt_file), receipts.load_public_key(raw))
    except receipts.ReceiptError as exc:
        raise click.ClickException(str(exc)) from exc
    if result.ok:
        click.echo(f"OK: {receipt_file} verifies ({result.reason})")
        return
    click.echo(f"FAILED: {receipt_file}: {result.reason}", err=True)
    sys.exit(1)


@receipt.command("keygen")
@click.argument("private_out", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("public_out", type=click.Path(dir_okay=False, path_type=Path))
def keygen(private_out: Path, public_out: Path) -> None:
    """Write a new Ed25519 key pair (PEM)."""
    key = receipts.generate_key()
    private_out.write_bytes(receipts.private_key_pem(key))
    private_out.chmod(0o600)
    public_out.write_bytes(receipts.public_key_pem(key.public_key()))
    click.echo(f"key id {receipts.default_key_id(key.public_key())}")
