"""`engine serve`'s stream modes, in process on a tiny random-weight shape: "token" sends a line per token,
"ends" the first token and then the rest in one line, with the same tokens."""

from __future__ import annotations

import io
import json

import pytest

from engine import generate as gen
from engine import serve

PROMPT = list(range(3, 40))


@pytest.fixture(scope="module")
def server() -> serve.Server:
    lm = gen.load_random("qwen3-tiny", "cpu", seed=3, max_pos=128)
    return serve.Server(lm, 128, io.StringIO())


def _lines(server: serve.Server, req: dict) -> list[dict]:
    server.out = io.StringIO()
    server.handle(req)
    return [json.loads(x) for x in server.out.getvalue().splitlines()]


def _tokens(lines: list[dict]) -> list[int]:
    return [t for x in lines for t in ([x["tok"]] if "tok" in x else x.get("toks", []))]


def test_ends_sends_the_first_token_then_the_rest_in_one_line_with_the_same_tokens(server):
    token = _lines(server, {"id": "a", "op": "generate", "prompt_ids": PROMPT, "max_new": 12})
    ends = _lines(
        server, {"id": "b", "op": "generate", "prompt_ids": PROMPT, "max_new": 12, "stream": "ends"}
    )
    assert [list(x) for x in token[:-1]] == [["id", "tok"]] * 12
    assert [sorted(x) for x in ends[:-1]] == [["id", "tok"], ["id", "toks"]]
    assert _tokens(ends) == _tokens(token) and len(_tokens(ends)) == 12
    assert ends[-1]["event"] == "done" and ends[-1]["n"] == 12
    one = _lines(server, {"id": "c", "op": "generate", "prompt_ids": PROMPT, "max_new": 1, "stream": "ends"})
    assert _tokens(one) == _tokens(token)[:1] and len(one) == 2  # one token: its line and done


def test_ends_holds_back_the_tokens_of_an_engine_that_streams_each_one_anyway(server, monkeypatch):
    real = server.session.generate
    monkeypatch.setattr(server.session, "generate", lambda *a, **k: real(*a, **{**k, "stream": True}))
    lines = _lines(
        server, {"id": "d", "op": "generate", "prompt_ids": PROMPT, "max_new": 9, "stream": "ends"}
    )
    assert [sorted(x) for x in lines[:-1]] == [["id", "tok"], ["id", "toks"]] and len(_tokens(lines)) == 9


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"stream": "chunks"}, "stream: expected one of token, ends"),
        ({"stream": "ends", "temperature": 0.7}, "greedy"),
    ],
)
def test_a_bad_stream_request_is_refused_by_name(server, extra, words):
    with pytest.raises(serve.RequestError, match=words):
        server.handle({"id": "e", "op": "generate", "prompt_ids": PROMPT, "max_new": 4, **extra})


# ------------------------------------------------------------------ the prompt in two parts (#36)


@pytest.mark.parametrize("stream", ["token", "ends"])
def test_a_prefill_then_its_continuation_decodes_what_the_whole_prompt_would(server, stream):
    whole = _lines(server, {"id": "w", "op": "generate", "prompt_ids": [*PROMPT, 77], "max_new": 10})
    done = _lines(server, {"id": "p", "op": "prefill", "prompt_ids": PROMPT})
    assert done == [{"id": "p", "event": "done", "n": len(PROMPT), "timings": done[0]["timings"]}]
    assert done[0]["timings"]["prefill_s"] > 0
    body = {"id": "c", "op": "generate", "continue": True, "prompt_ids": [77], "max_new": 10}
    cont = _lines(server, {**body, "stream": stream} if stream == "ends" else body)
    assert _tokens(cont) == _tokens(whole) and cont[-1]["n"] == 10


def test_the_first_decoded_token_depends_on_the_continuation(server):
    """Why two parts close the shift: nothing decoded after the prompt is known before the harness sends
    the continuation, so no decode step can be done ahead of the decode clock."""
    firsts = set()
    for t in (5, 77, 140, 201):
        _lines(server, {"id": "p", "op": "prefill", "prompt_ids": PROMPT})
        cont = _lines(
            server, {"id": "c", "op": "generate", "continue": True, "prompt_ids": [t], "max_new": 3}
        )
        firsts.add(tuple(_tokens(cont)))
    assert len(firsts) > 1


def test_one_continuation_per_prefill_and_any_other_request_drops_it(server):
    _lines(server, {"id": "p", "op": "prefill", "prompt_ids": PROMPT})
    _lines(server, {"id": "c", "op": "generate", "continue": True, "prompt_ids": [7], "max_new": 2})
    with pytest.raises(serve.RequestError, match="no prefilled prompt waits"):
        server.handle({"id": "d", "op": "generate", "continue": True, "prompt_ids": [7], "max_new": 2})
    _lines(server, {"id": "p", "op": "prefill", "prompt_ids": PROMPT})
    _lines(server, {"id": "s", "op": "score", "ids": PROMPT[:5]})
    with pytest.raises(serve.RequestError, match="no prefilled prompt waits"):
        server.handle({"id": "e", "op": "generate", "continue": True, "prompt_ids": [7], "max_new": 2})


@pytest.mark.parametrize(
    ("req", "words"),
    [
        ({"op": "prefill", "prompt_ids": list(range(128))}, "leave no room"),
        ({"op": "prefill", "prompt_ids": []}, "prompt_ids"),
        ({"op": "generate", "continue": "yes", "prompt_ids": [1], "max_new": 2}, "continue: expected"),
    ],
)
def test_a_bad_two_part_request_is_refused_by_name(server, req, words):
    with pytest.raises(serve.RequestError, match=words):
        server.handle({"id": "x", **req})


def test_the_continuation_fits_the_cache_or_is_refused(server):
    _lines(server, {"id": "p", "op": "prefill", "prompt_ids": list(range(120))})
    with pytest.raises(serve.RequestError, match="max_new"):
        server.handle({"id": "c", "op": "generate", "continue": True, "prompt_ids": [1], "max_new": 8})


def test_an_engine_whose_session_cannot_continue_lists_no_prefill_and_refuses_it(monkeypatch):
    """An engine package older than the two-part request: its ready line says so (and the harness, where
    main's engine answers prefill, fails that side by name) instead of a crash at the first prefill."""
    lm = gen.load_random("qwen3-tiny", "cpu", seed=3, max_pos=64)
    full = serve.Server(lm, 64, io.StringIO())
    assert "prefill" in full.ops()

    def old_generate(prompt_ids, max_new, params=None, stop_ids=frozenset(), on_token=None, stream=True):
        raise AssertionError("not called")

    old = serve.Server(lm, 64, io.StringIO())
    monkeypatch.setattr(old.session, "generate", old_generate)
    assert "prefill" not in old.ops() and "generate" in old.ops()
    with pytest.raises(serve.RequestError, match="not one this engine answers"):
        old.handle({"id": "p", "op": "prefill", "prompt_ids": PROMPT})
    bare = serve.Server(lm, 64, io.StringIO())
    monkeypatch.setattr(type(bare.session), "prefill", None)
    assert "prefill" not in bare.ops()
