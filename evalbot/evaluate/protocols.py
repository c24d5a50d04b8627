"""How a serving process is started for the protocol engine.yaml names. Pure, given the interpreter.

`evalbot.serve/1` engines are started as their argv says. An HTTP engine (`llama-server/1`, or
`openai-completions/1`: a server of OpenAI-compatible completions that returns token ids) is started
behind the harness's relay (`http_relay.py`, run by its path with the harness's own base interpreter in
isolated mode, never the engine's): the relay is the sandbox's first process, speaks evalbot.serve/1 to the
harness and HTTP to the engine on the sandbox's private loopback, at {port}.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from evalbot.rules.schema import HTTP_PROTOCOLS, OPENAI_PROTOCOL

RELAY = Path(__file__).with_name("http_relay.py")
SANDBOX_PORT = 8080  # each sandbox has a loopback of its own: no other process can hold it


@dataclass(frozen=True)
class Serving:
    """What to start, and the paths beyond the engine's own that its sandbox must show read-only."""

    argv: list[str]
    binds: tuple[Path, ...] = ()


def port_for(protocol: str, sandboxed: bool) -> str:
    """{port}: fixed in a sandbox (its loopback is its own), a free one of the host's without (a trusted
    engine checked --no-sandbox); empty for a stdio protocol."""
    if protocol not in HTTP_PROTOCOLS:
        return ""
    if sandboxed:
        return str(SANDBOX_PORT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def relay_python() -> str:
    """The harness's base interpreter (a venv's python is a link into a folder the sandbox does not show;
    the base install is among its system binds)."""
    return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())


class ProtocolError(ValueError):
    """An engine that cannot be served as its protocol needs (an OpenAI server without a model file)."""


def vocab_of(model: Path) -> int:
    """The vocabulary's size of a GGUF model file (its tokenizer's token list), read with gguf."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(model, "r").fields.get("tokenizer.ggml.tokens")
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:  # a file that is no GGUF
        raise ProtocolError(f"cannot read the vocabulary of {model}: {exc}") from exc
    if field is None or len(field.data) < 2:
        raise ProtocolError(
            f"{model} names no tokenizer.ggml.tokens: no vocabulary to check token ids against"
        )
    return len(field.data)


def serving(protocol: str, engine_argv: list[str], port: str, model: Path | None = None) -> Serving:
    """The argv that serves `protocol` from the engine's own argv (its {port} already filled in). An
    OpenAI-compatible server does not say its vocabulary's size: the relay is given the model file's."""
    if protocol not in HTTP_PROTOCOLS:
        return Serving(engine_argv)
    extra: list[str] = []
    if protocol == OPENAI_PROTOCOL:
        if model is None:
            raise ProtocolError(
                f"a {protocol} engine serves a model file (its vocabulary bounds the token ids): not a shape"
            )
        extra = ["--vocab", str(vocab_of(model))]
    argv = [
        relay_python(),
        "-I",
        str(RELAY),
        "--port",
        port,
        "--protocol",
        protocol,
        *extra,
        "--",
        *engine_argv,
    ]
    return Serving(argv, (RELAY,))
