"""The console's session store: the token is kept only as a digest, sessions end by
logout, revocation and age, and one key cannot push other keys' sessions out."""

from __future__ import annotations

import time

from starlette.datastructures import Headers

from agent_sandbox.surfaces.console.guard import cookie_token, same_origin
from agent_sandbox.surfaces.console.sessions import Sessions


def test_a_session_is_found_by_its_token_only_and_ends_on_close() -> None:
    store = Sessions()
    token, session = store.open("key-1")
    assert store.get(token) == session and store.get(token + "x") is None
    assert token not in repr(store.__dict__)  # a digest is kept, not the cookie
    store.close(token)
    assert store.get(token) is None


def test_revocation_and_age_end_sessions() -> None:
    store = Sessions(ttl=0.05)
    mine, _ = store.open("key-1")
    other, _ = store.open("key-2")
    store.close_key("key-1")
    assert store.get(mine) is None and store.get(other) is not None
    time.sleep(0.06)
    assert store.get(other) is None


def test_a_key_cannot_crowd_out_another_keys_sessions() -> None:
    store = Sessions(most=10, per_key=3)
    kept, _ = store.open("key-victim")
    tokens = [store.open("key-noisy")[0] for _ in range(50)]
    assert store.get(kept) is not None
    assert [store.get(t) is not None for t in tokens[-4:]] == [False, True, True, True]


def test_cookie_and_origin_parsing_refuse_what_is_malformed() -> None:
    assert cookie_token(Headers({"cookie": "a=1; abx_console=tok"})) == "tok"
    assert cookie_token(Headers({"cookie": "abx_console="})) is None
    assert cookie_token(Headers({})) is None
    host = {"host": "gw.example:8000"}
    assert same_origin(Headers({**host, "origin": "https://gw.example:8000"}))
    assert not same_origin(Headers({**host, "origin": "https://gw.example.evil:8000"}))
    assert not same_origin(Headers({**host, "origin": "null"}))
    assert not same_origin(Headers(host))
