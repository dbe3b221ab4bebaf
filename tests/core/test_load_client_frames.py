"""The WebSocket bytes every load client speaks (loadtest/clients/websocket.py):
the lean, million and peers clients read the server's answer and frames with
these functions, so their figures count the same messages."""

from __future__ import annotations

from websockets.frames import Frame, Opcode

from daemon.wire import FrameReader
from loadtest.clients.websocket import Handshake, head_status, masked, split_messages, upgrade_request


def test_the_head_is_read_once_whole() -> None:
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    assert head_status(head[:20]) == (None, head[:20])
    assert head_status(head + b"\x81\x02{}") == (101, b"\x81\x02{}")
    assert head_status(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")[0] == 503


def test_the_handshake_is_read_across_chunks_and_hands_on_the_frames_after_it() -> None:
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    handshake = Handshake()
    assert handshake.read(head[:20]) == b"" and handshake.status == 0 and not handshake.refused
    assert handshake.read(head[20:] + b"\x81\x02{}") == b"\x81\x02{}"
    assert handshake.status == 101 and not handshake.refused
    opened_alone = Handshake()
    assert opened_alone.read(head) == b"" and opened_alone.status == 101


def test_a_refused_handshake_says_its_status_and_hands_on_nothing() -> None:
    handshake = Handshake()
    assert handshake.read(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nfull") == b""
    assert handshake.status == 503 and handshake.refused


def test_the_upgrade_request_carries_its_path_and_headers() -> None:
    request = upgrade_request("127.0.0.1", 8080, "/v1/ws?since=7", "Authorization: Bearer t\r\n")
    assert request.startswith(b"GET /v1/ws?since=7 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in request and request.endswith(b"\r\n\r\n")


def test_frames_of_every_length_form_split_where_they_end() -> None:
    payloads = [b"x" * 5, b"y" * 300, b"z" * 70_000, b""]
    wire = b"".join(Frame(Opcode.TEXT, p).serialize(mask=False) for p in payloads)
    wire += Frame(Opcode.PING, b"").serialize(mask=False)
    for cut in (1, 3, 7, 320, len(wire) - 1):
        first, rest, partial = split_messages(wire[:cut], None)
        second, left, partial = split_messages(rest + wire[cut:], partial)
        assert [p for _, p in first + second] == [*payloads, b""] and left == b"" and partial is None
    assert split_messages(wire, None)[0][-1] == (9, b"")


def test_fragmented_server_messages_are_joined_and_control_frames_pass_between() -> None:
    def frame(first: int, payload: bytes) -> bytes:
        n = len(payload)
        head = bytes([first, n]) if n < 126 else bytes([first, 126]) + n.to_bytes(2, "big")
        return head + payload

    big = b"x" * 300
    data = frame(0x81, b'{"id":1}') + frame(0x01, b"ab") + frame(0x89, b"p") + frame(0x80, b"cd") + frame(0x81, big)
    got, rest, partial = split_messages(data + frame(0x81, b"tail")[:3], None)
    assert got == [(1, b'{"id":1}'), (9, b"p"), (1, b"abcd"), (1, big)]
    assert rest == frame(0x81, b"tail")[:3] and partial is None
    got, rest, partial = split_messages(frame(0x01, b"open"), None)
    assert got == [] and rest == b"" and partial == (1, [b"open"])
    got, _, partial = split_messages(frame(0x80, b"ed"), partial)
    assert got == [(1, b"opened")] and partial is None


def test_its_client_frames_are_masked_frames_a_server_reads() -> None:
    frames = FrameReader(max_size=125).feed(masked(0xA, b"ab") + masked(0x8, b""))
    assert [(f.opcode, f.data) for f in frames] == [(Opcode.PONG, b"ab"), (Opcode.CLOSE, b"")]
