"""The HTTP protocol (`llama-server/1`, #38 part 2): the harness's relay in front of an engine that serves
HTTP, against a stand-in llama-server (tests/fixtures/llama_server_double.py) through the conformance kit,
sandboxed where bubblewrap works, and what the relay refuses: a token past the vocabulary, more tokens
than asked, and an engine that reaches for the relay through /proc."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from evalbot.evaluate import conformance, http_relay, protocols, sandbox, served
from evalbot.evaluate.context import ro_binds
from evalbot.rules import RulesError
from evalbot.rules.load import load_rules
from evalbot.rules.schema import default_rules_dir

DOUBLE = Path(__file__).resolve().parents[1] / "fixtures" / "llama_server_double.py"
PROTOCOL = "llama-server/1"


def starter(tmp_path: Path, brk: str = "", sandboxed: bool = False, extra: tuple[str, ...] = ()):
    port = protocols.port_for(PROTOCOL, sandboxed)
    engine = [sys.executable, "-I", str(DOUBLE), "--port", port, *(["--break", brk] if brk else []), *extra]
    how = protocols.serving(PROTOCOL, engine, port)

    def start() -> served.ServedProcess:
        spec = sandbox.SandboxSpec(
            ro_binds=tuple(ro_binds([DOUBLE, *how.binds])), scratch=tmp_path, workdir=tmp_path,
            env={"PATH": "/usr/bin:/bin"}, limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
        )  # fmt: skip
        return served.ServedProcess.start(conformance.LABEL, spec, how.argv, no_sandbox=not sandboxed,
                                          protocol=PROTOCOL)  # fmt: skip

    return start


def run_kit(
    tmp_path: Path, brk: str = "", sandboxed: bool = False, extra: tuple[str, ...] = ()
) -> dict[str, conformance.Outcome]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    got = conformance.check(starter(tmp_path, brk, sandboxed, extra), timeout_s=20)
    print("\n".join(o.line() for o in got))
    return {o.id: o for o in got}


def test_an_http_engine_behind_the_relay_passes_every_requirement(tmp_path):
    got = run_kit(tmp_path)
    assert [o.id for o in got.values() if not o.passed] == []
    assert not any(o.skipped for o in got.values())


@pytest.mark.skipif(not sandbox.sandbox_available(), reason="needs bubblewrap")
def test_the_relay_and_its_engine_run_in_the_sandbox_on_its_own_loopback(tmp_path):
    got = run_kit(tmp_path, sandboxed=True)
    assert [o.id for o in got.values() if not o.passed] == []


@pytest.mark.parametrize("sandboxed", [False, True])
def test_an_engine_cannot_reach_the_relay_through_proc(tmp_path, sandboxed):
    """The engine runs as the relay's child, as the same user: the relay made itself non-dumpable first, so
    its pipes, memory and environment are closed to it, and a forged ready line never reaches the harness."""
    if sandboxed and not sandbox.sandbox_available():
        pytest.skip("needs bubblewrap")
    if not sandboxed and os.geteuid() == 0:
        pytest.skip("root may ptrace any process of the host: unsandboxed, the relay guards only a user's")
    p = starter(tmp_path, "proc-attack", sandboxed)()
    try:
        ready = p.wait_ready(20)
        assert ready.get("relay") == "evalbot http_relay" and "forged" not in ready
        got = p.request({"op": "generate", "prompt_ids": [1, 2, 3], "max_new": 4}, 20)
        assert len(got.tokens) == 4
    finally:
        p.close()
    attack = json.loads((tmp_path / "attack.json").read_text())
    assert all(v.startswith("refused") for v in attack.values()), attack


@pytest.mark.parametrize(
    "brk, failing, reason",
    [
        ("vocab", "tokens-in-vocabulary", "103"),
        ("extra", "generate-token-stream", "asked for 8 tokens one a line, got [1, 1, 1, 1, 1, 1, 1, 1, 1]"),
    ],
)
def test_an_http_engine_that_breaks_its_contract_fails_the_requirement(tmp_path, brk, failing, reason):
    got = run_kit(tmp_path, brk)
    assert not got[failing].passed and reason in (got[failing].failure or ""), got[failing].line()


def test_score_answers_teacher_forced_and_saves_every_positions_log_probs(tmp_path):
    p = starter(tmp_path)()
    try:
        p.wait_ready(20)
        ids = [5, 9, 2, 7, 1, 3]
        got = p.request({"op": "score", "ids": ids, "from": 2, "save": "s.npy"}, 20)
    finally:
        p.close()
    want = [(sum(ids[: i + 1]) * 7 + i + 1) % 100 for i in range(1, len(ids) - 1)]
    assert got.summary["argmax"] == want
    assert got.summary["top1"] == [w == ids[i + 2] for i, w in enumerate(want)]
    assert got.summary["margin"] == pytest.approx([math.log(0.9) - math.log(0.05)] * len(want))
    rows = np.load(tmp_path / "s.npy")
    assert rows.shape == (len(want), 100) and rows.dtype == np.float32
    assert list(rows.argmax(1)) == want
    assert np.exp(rows.astype(np.float64)).sum(1) == pytest.approx(1.0, abs=1e-5)


def test_sse_events_stop_at_done_and_refuse_garbage():
    lines = [b": comment\n", b'data: {"tokens": [1]}\n', b"\n", b"data: [DONE]\n", b'data: {"tokens": [2]}\n']
    assert list(http_relay.sse_events(iter(lines))) == [{"tokens": [1]}]
    with pytest.raises(http_relay.EngineError, match="not JSON"):
        list(http_relay.sse_events(iter([b"data: {oops\n"])))
    with pytest.raises(http_relay.EngineError, match="runs past 1 MiB"):
        list(http_relay.sse_events(iter([b"data: " + b"7" * http_relay.MAX_EVENT_BYTES])))
    with pytest.raises(http_relay.EngineError, match="answered an error"):
        list(http_relay.sse_events(iter([b'data: {"error": {"message": "slot busy"}}\n'])))


def test_chunk_tokens_pass_on_what_the_engine_sent_for_the_harness_to_check():
    assert http_relay.chunk_tokens({"tokens": [0, 100, "x"]}) == [0, 100, "x"]
    assert http_relay.chunk_tokens({"content": "a"}) == []
    with pytest.raises(http_relay.EngineError, match="not a list"):
        http_relay.chunk_tokens({"tokens": 3})


def test_the_greedy_body_asks_n_tokens_greedily_from_ids_never_biasing_the_end_of_generation_away():
    body = http_relay.greedy_body([1, 2], 5, True, False)
    assert body["prompt"] == [1, 2] and body["n_predict"] == 5 and "ignore_eos" not in body
    assert body["top_k"] == 1 and body["samplers"] == ["top_k"] and body["return_tokens"] is True


def test_a_dense_row_keeps_the_top_k_and_spreads_the_rest_of_the_mass(tmp_path):
    row = http_relay.dense_row([(3, math.log(0.5)), (7, math.log(0.3))], 10)
    assert row[3] == pytest.approx(math.log(0.5)) and row[0] == pytest.approx(math.log(0.2 / 8))
    http_relay.write_npy(tmp_path / "r.npy", [row, row], 10)
    assert np.load(tmp_path / "r.npy").shape == (2, 10)


def test_the_relay_answers_a_request_it_cannot_turn_into_http_with_an_error_for_its_id():
    out = io.StringIO()
    relay = http_relay.Relay(1, out)
    relay.vocab = 100
    for req, why in (
        ({"id": "a", "op": "generate", "prompt_ids": [1], "max_new": 0}, "max_new"),
        ({"id": "b", "op": "generate", "prompt_ids": [1], "max_new": 2, "continue": True}, "no prefilled"),
        ({"id": "c", "op": "score", "ids": [1, 2], "from": 1, "save": "../x.npy"}, "save"),
        ({"id": "d", "op": "spec"}, "unknown op"),
    ):
        with pytest.raises(http_relay.RequestError, match=why):
            relay.answer(req)


def _engine_yaml(tmp_path: Path, argv: str) -> Path:
    rules = tmp_path / str(abs(hash(argv))) / "rules"
    shutil.copytree(default_rules_dir(), rules)
    (rules / "engine.yaml").write_text(
        "protocol: llama-server/1\nbuild: {commands: [[make]]}\nserve:\n"
        f"  argv: {argv}\n  model_file: ['-m', '{{model}}']\n  random_weights: ['--shape', '{{shape}}']\n"
        "contributor: {bench: 'llama-bench -p {ctx}'}\n"
    )
    return rules


def test_an_http_engine_must_listen_on_the_port_the_harness_names(tmp_path):
    with pytest.raises(RulesError, match=r"engine.yaml:4.*must listen on \{port\}"):
        load_rules(_engine_yaml(tmp_path, "['{tree}/build/bin/llama-server', '-c', '{max_seq}']"))
    rules = load_rules(_engine_yaml(tmp_path, "['{tree}/build/bin/llama-server', '--port', '{port}']"))
    assert rules.engine.protocol == PROTOCOL


def test_an_engine_without_random_weights_is_refused_where_the_rules_name_a_shape(tmp_path):
    rules = _engine_yaml(tmp_path, "['llama-server', '--port', '{port}']")
    text = (rules / "engine.yaml").read_text()
    (rules / "engine.yaml").write_text(text.replace("  random_weights: ['--shape', '{shape}']\n", ""))
    with pytest.raises(RulesError, match=r"models.yaml: models: the shape\(s\) .* engine serves none"):
        load_rules(rules)


# ---------------------------------------------------------------- openai-completions/1

OPENAI = "openai-completions/1"


def tiny_gguf(tmp_path: Path, vocab: int = 100) -> Path:
    """A GGUF that holds only a tokenizer of `vocab` tokens: where the harness reads an OpenAI-compatible
    engine's vocabulary from."""
    from gguf import GGUFWriter

    path = tmp_path / f"vocab{vocab}.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def oai_starter(tmp_path: Path, dialect: str, brk: str = "", extra: tuple[str, ...] = ()):
    port = protocols.port_for(OPENAI, False)
    engine = [sys.executable, "-I", str(DOUBLE), "--port", port, "--oai", dialect]
    engine += [*(["--break", brk] if brk else []), *extra]
    how = protocols.serving(OPENAI, engine, port, tiny_gguf(tmp_path))

    def start() -> served.ServedProcess:
        spec = sandbox.SandboxSpec(
            ro_binds=tuple(ro_binds([DOUBLE, *how.binds])), scratch=tmp_path, workdir=tmp_path,
            env={"PATH": "/usr/bin:/bin"}, limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
        )  # fmt: skip
        return served.ServedProcess.start(conformance.LABEL, spec, how.argv, no_sandbox=True, protocol=OPENAI)

    return start


@pytest.mark.parametrize("dialect", ["llama", "vllm-ids", "vllm-strings"])
def test_an_openai_compatible_server_passes_every_requirement_in_each_servers_dialect(tmp_path, dialect):
    """Token ids as llama-server (logprobs.content[].id), vLLM's return_token_ids and vLLM's
    return_tokens_as_token_ids give them: every requirement of the kit holds; the two-part clock's is
    skipped, saying the engine answers no prefill."""
    got = {o.id: o for o in conformance.check(oai_starter(tmp_path, dialect), timeout_s=20)}
    print("\n".join(o.line() for o in got.values()))
    assert [o.id for o in got.values() if not o.passed] == []
    skipped = [o for o in got.values() if o.skipped]
    assert skipped and all("prefill" in (o.failure or o.line()) for o in skipped)


@pytest.mark.parametrize("dialect", ["llama", "vllm-strings"])
def test_openai_score_reads_the_top_log_probs_as_token_ids(tmp_path, dialect):
    p = oai_starter(tmp_path, dialect)()
    try:
        assert p.wait_ready(20)["protocol"] == OPENAI and p.vocab == 100
        ids = [5, 9, 2, 7, 1, 3]
        got = p.request({"op": "score", "ids": ids, "from": 2, "save": "s.npy"}, 20)
        toks = p.request({"op": "tokenize", "text": "abc", "max_tokens": 2}, 20)
    finally:
        p.close()
    want = [(sum(ids[: i + 1]) * 7 + i + 1) % 100 for i in range(1, len(ids) - 1)]
    assert got.summary["argmax"] == want
    assert got.summary["margin"] == pytest.approx([math.log(0.9) - math.log(0.05)] * len(want))
    assert list(np.load(tmp_path / "s.npy").argmax(1)) == want
    assert toks.summary["ids"] == [97, 98]


def test_an_openai_server_that_streams_text_without_token_ids_fails_its_side(tmp_path):
    """The harness times token ids, never text: a server that gives none (no return_token_ids) fails,
    saying how to ask for them."""
    got = {o.id: o for o in conformance.check(oai_starter(tmp_path, "llama", "text"), timeout_s=20)}
    stream = got["generate-token-stream"]
    assert not stream.passed and "carries text but no token ids" in (stream.failure or ""), stream.line()
    assert "return_token_ids" in (stream.failure or "")  # and how to ask for them


def test_an_openai_engines_vocabulary_comes_from_its_model_file(tmp_path):
    assert protocols.vocab_of(tiny_gguf(tmp_path, 77)) == 77
    how = protocols.serving(OPENAI, ["vllm", "serve"], "8080", tiny_gguf(tmp_path, 77))
    assert how.argv[how.argv.index("--vocab") + 1] == "77" and how.argv[-2:] == ["vllm", "serve"]
    with pytest.raises(protocols.ProtocolError, match="serves a model file"):
        protocols.serving(OPENAI, ["vllm", "serve"], "8080", None)
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(protocols.ProtocolError, match=r"junk\.gguf"):
        protocols.vocab_of(tmp_path / "junk.gguf")


def test_openai_token_ids_are_read_in_every_dialect_and_text_alone_is_refused():
    ids = http_relay.openai_tokens
    assert ids({"choices": [{"text": "a", "token_ids": [4, 5]}]}) == [4, 5]
    assert ids({"choices": [{"text": "a", "logprobs": {"content": [{"id": 6}, {"id": 7}]}}]}) == [6, 7]
    assert ids({"choices": [{"text": "a", "logprobs": {"tokens": ["token_id:8", "oops"]}}]}) == [8, "oops"]
    assert ids({"choices": [], "usage": {"completion_tokens": 3}}) == []
    with pytest.raises(http_relay.EngineError, match="text but no token ids"):
        ids({"choices": [{"text": "hello", "logprobs": None}]})
    top = http_relay.openai_top({"logprobs": {"top_logprobs": [{"token_id:3": -2.0, "token_id:9": -0.5}]}})
    assert top == [(9, -0.5), (3, -2.0)]
    with pytest.raises(http_relay.EngineError, match=r"not \(token id, logprob\)"):
        http_relay.openai_top({"logprobs": {"top_logprobs": [{"hello": -0.1, "world": -1.0}]}})


def test_an_openai_engine_is_refused_where_the_rules_name_a_shape(tmp_path):
    rules = _engine_yaml(tmp_path, "['vllm', 'serve', '--port', '{port}']")
    text = (rules / "engine.yaml").read_text()
    (rules / "engine.yaml").write_text(text.replace("protocol: llama-server/1", f"protocol: {OPENAI}"))
    with pytest.raises(RulesError, match=r"models.yaml: models: the shape\(s\) .* no model file"):
        load_rules(rules)


def _chain(prompt: list[int], n: int, vocab: int = 100) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append((sum(seq) * 7 + len(seq)) % vocab)
        seq.append(out[-1])
    return out


def test_every_token_id_arrives_though_llama_server_withholds_a_token_that_ends_mid_character(tmp_path):
    """llama-server sends no chunk for a token that ends inside a UTF-8 character, so its id is never
    streamed (CI of the llama.cpp contest: "asked for 24 tokens, the engine streamed 20", a REJECT of a
    side for its server's stream). The relay sees the count run ahead and gives every id in its place,
    from a replay of the request; a continuation is asked whole (its clock ends at its last token)."""
    p = starter(tmp_path, extra=("--split-utf8", "3"))()
    try:
        p.wait_ready(20)
        prompt = [5, 9, 2, 7]
        for stream in ("token", "ends"):
            body = {"op": "generate", "prompt_ids": prompt, "max_new": 9}
            got = p.request(body | ({"stream": "ends"} if stream == "ends" else {}), 20)
            assert list(got.tokens) == _chain(prompt, 9), stream
        p.request({"op": "prefill", "prompt_ids": prompt}, 20)
        got = p.request({"op": "generate", "prompt_ids": [11], "max_new": 9, "continue": True}, 20)
        assert list(got.tokens) == _chain([*prompt, 11], 9)
    finally:
        p.close()
    kit = run_kit(tmp_path / "kit", extra=("--split-utf8", "2"))
    assert [o.id for o in kit.values() if not o.passed] == []


def test_an_openai_server_that_never_gives_a_withheld_tokens_id_fails_saying_so(tmp_path):
    got = {
        o.id: o
        for o in conformance.check(oai_starter(tmp_path, "llama", extra=("--split-utf8", "3")), timeout_s=20)
    }
    stream = got["generate-token-stream"]
    assert not stream.passed and "a llama-server is llama-server/1" in (stream.failure or ""), stream.line()


@pytest.mark.parametrize("split", ["0", "3"])
def test_the_relay_gives_the_models_greedy_tokens_through_its_end_of_generation_tokens(tmp_path, split):
    """llama-server's ignore_eos biases every end-of-generation token to -inf, so its tokens are no longer
    the model's greedy ones (judging llama.cpp, the decode audit saw <|im_start|> where the model's argmax
    was <|im_end|>, on main as on the PR: an INFRA_ERROR). The relay asks without it, and on after each
    such token: the tokens are the greedy chain, the EOG tokens in it, streamed, whole and continued, and
    though the stream also withholds some."""
    eog = 69  # the third token of the chain after [5, 9, 2, 7]
    p = starter(tmp_path, extra=("--eog", str(eog), "--split-utf8", split))()
    try:
        p.wait_ready(20)
        prompt = [5, 9, 2, 7]
        for stream in ("token", "ends"):
            body = {"op": "generate", "prompt_ids": prompt, "max_new": 9}
            got = p.request(body | ({"stream": "ends"} if stream == "ends" else {}), 20)
            assert list(got.tokens) == _chain(prompt, 9) and eog in got.tokens, stream
        p.request({"op": "prefill", "prompt_ids": prompt[:3]}, 20)
        got = p.request({"op": "generate", "prompt_ids": prompt[3:], "max_new": 9, "continue": True}, 20)
        assert list(got.tokens) == _chain(prompt, 9)
    finally:
        p.close()
