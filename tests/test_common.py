"""common/: the helpers k3 and the engine share."""

from __future__ import annotations

import socket

import httpx
import pytest

from common.listen import listening_socket, serve_in_thread
from common.scan import held_suffix
from common.think import ThinkTags

TEXT = "<think>plan <it></think>The answer</thin k>."


def split(text: str, cuts: list[int], start_in_think: bool = False) -> list[tuple[bool, str]]:
    tags = ThinkTags(start_in_think)
    pieces = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        pieces += tags.feed(text[a:b])
    pieces += tags.finish()
    merged: list[tuple[bool, str]] = []
    for thinking, piece in pieces:
        if merged and merged[-1][0] == thinking:
            merged[-1] = (thinking, merged[-1][1] + piece)
        else:
            merged.append((thinking, piece))
    return merged


@pytest.mark.parametrize("cut", range(len(TEXT) + 1))
def test_think_tags_split_the_same_at_every_chunk_boundary(cut):
    assert split(TEXT, [cut]) == [(True, "plan <it>"), (False, "The answer</thin k>.")]


def test_stray_and_nested_tags_are_dropped_and_an_open_block_can_start_the_stream():
    assert split("a</think>b<think>c<think>d</think>e", []) == [(False, "ab"), (True, "cd"), (False, "e")]
    assert split("reason</think>answer", [3], start_in_think=True) == [(True, "reason"), (False, "answer")]
    assert split("answer <thi", []) == [(False, "answer <thi")]  # an unfinished tag is text at the end


def test_held_suffix_holds_only_a_possible_start_of_a_marker():
    assert held_suffix("stop at ST", ["STOP"]) == 2
    assert held_suffix("stop at S!", ["STOP"]) == 0
    assert held_suffix("anything", []) == 0


def test_listening_socket_refuses_a_busy_port_and_serves():
    sock = listening_socket("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", sock.getsockname()[1])
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    finally:
        sock.close()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with serve_in_thread(app) as root:
        assert httpx.get(root + "/").text == "ok"
