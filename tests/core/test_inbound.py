"""Client frames judged as RFC 6455 asks (daemon.inbound), bytes in and
events out, with no socket."""

import hashlib

import pytest

from daemon.inbound import FRAGMENT, Control, Ending, Inbound, DataMessage
from daemon.wire import Opcode

TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes = b"", fin: bool = True, rsv: int = 0, masked: bool = True,
          length: int | None = None) -> bytes:
    """One client frame; ``length`` announces another payload length than the one sent."""
    n = len(payload) if length is None else length
    head = bytes((0x80 * fin | rsv << 4 | opcode,))
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes((mask_bit | n,))
    elif n < 65536:
        head += bytes((mask_bit | 126,)) + n.to_bytes(2, "big")
    else:
        head += bytes((mask_bit | 127,)) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    # a mask of its own for each frame, the same in every run: the test ids hold these bytes,
    # and pytest-xdist's workers must collect the same ids
    key = hashlib.sha256(bytes([opcode, fin]) + payload).digest()[:4]
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close(code: int, reason: bytes = b"") -> bytes:
    return frame(CLOSE, code.to_bytes(2, "big") + reason)


def fed(data: bytes, keep: bool = False, max_frame: int = 4096, max_message: int | None = None,
        chunk: int | None = None) -> list:
    reader = Inbound(max_frame, max_message, keep)
    if chunk is None:
        return reader.feed(data)
    return [event for at in range(0, len(data), chunk) for event in reader.feed(data[at:at + chunk])]


def code_of(events: list) -> int:
    assert type(events[-1]) is Ending, events
    return events[-1].code


def test_a_whole_text_message_is_reported_and_kept_only_when_asked():
    data = frame(TEXT, "héllo".encode())
    assert fed(data) == [DataMessage(Opcode.TEXT, b"")]
    assert fed(data, keep=True) == [DataMessage(Opcode.TEXT, "héllo".encode())]


@pytest.mark.parametrize("chunk", [None, 1, 3, 7])
def test_fragments_reassemble_with_a_ping_answered_between_them_however_the_bytes_arrive(chunk):
    word = "κόσμε".encode()  # a two-byte character split between the fragments
    data = frame(TEXT, word[:3], fin=False) + frame(PING, b"p") + frame(CONT, word[3:7], fin=False) + \
        frame(CONT, word[7:]) + frame(BINARY, b"\x00\xff")
    assert fed(data, keep=True, chunk=chunk) == [
        FRAGMENT, Control(Opcode.PING, b"p"), FRAGMENT, DataMessage(Opcode.TEXT, word),
        DataMessage(Opcode.BINARY, b"\x00\xff")]


def test_invalid_utf8_fails_with_1007_at_its_fragment_before_the_message_ends():
    reader = Inbound(4096)
    assert reader.feed(frame(TEXT, "κόσμε".encode(), fin=False)) == [FRAGMENT]
    assert code_of(reader.feed(frame(CONT, b"\xf4\x90\x80\x80", fin=False))) == 1007


def test_invalid_utf8_fails_with_1007_inside_a_frame_before_its_payload_is_in():
    data = frame(TEXT, b"ok \xff" + b"x" * 1000)
    reader = Inbound(4096)
    assert code_of(reader.feed(data[:12])) == 1007  # 8 bytes of header, then "ok \xff"


def test_a_text_message_that_ends_inside_a_character_fails_with_1007():
    assert code_of(fed(frame(TEXT, b"ok\xce", fin=False) + frame(CONT, b""))) == 1007
    assert code_of(fed(frame(TEXT, b"\xed\xa0\x80"))) == 1007  # a surrogate


@pytest.mark.parametrize("data, why", [
    (frame(CONT, b"x"), "continuation frame with no message to continue"),
    (frame(TEXT, b"a", fin=False) + frame(TEXT, b"b"), "new message inside a fragmented message"),
    (frame(PING, b"", fin=False), "fragmented control frame"),
    (frame(PING, b"x" * 126), "control frame over 125 bytes"),
    (frame(TEXT, b"x", rsv=4), "reserved bits set"),
    (frame(0x3), "reserved opcode"),
    (frame(0xB), "reserved opcode"),
    (frame(TEXT, b"hi", masked=False), "unmasked client frame"),
    (frame(BINARY, length=1 << 63), "frame length with its most significant bit set"),
])
def test_protocol_violations_fail_with_1002_and_a_reason(data, why):
    assert fed(data, max_frame=1 << 64)[-1] == Ending(1002, why, "protocol_error")


def test_frames_before_a_violation_are_reported_and_nothing_after_it_is_read():
    reader = Inbound(4096)
    events = reader.feed(frame(PING, b"1") + frame(0x3) + frame(PING, b"2"))
    assert events == [Control(Opcode.PING, b"1"), Ending(1002, "reserved opcode", "protocol_error")]
    assert reader.feed(frame(PING, b"3")) == []


def test_a_frame_over_the_limit_fails_with_1009_on_its_header_alone():
    header = frame(BINARY, length=5000)  # announced, never sent
    assert fed(header) == [Ending(1009, "frame too big", "frame_too_big")]


def test_a_kept_message_over_its_limit_fails_with_1009():
    data = frame(BINARY, b"x" * 600, fin=False) + frame(CONT, b"x" * 600)
    assert fed(data, keep=True, max_message=1000)[-1] == Ending(1009, "message too big", "frame_too_big")
    assert fed(data, keep=False, max_message=1000)[-1] == DataMessage(Opcode.BINARY, b"")  # not kept: no bound


@pytest.mark.parametrize("payload, answer", [
    (b"", 1000), (b"\x03\xe8", 1000), (b"\x03\xe9", 1001), (b"\x0b\xb8", 3000), (b"\x13\x87", 4999),
    (b"\x03\xe8" + "fin κόσμε".encode(), 1000),
])
def test_a_close_is_answered_with_its_own_code(payload, answer):
    assert fed(frame(CLOSE, payload)) == [Ending(answer, "", None)]


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535])
def test_a_close_with_an_invalid_code_fails_with_1002(code):
    assert code_of(fed(close(code))) == 1002


def test_a_close_with_one_byte_or_a_reason_not_utf8_fails_with_1002_or_1007():
    assert code_of(fed(frame(CLOSE, b"\x03"))) == 1002
    assert code_of(fed(close(1000, b"\xff\xfe bad"))) == 1007


def test_the_reader_holds_state_only_while_something_is_unfinished():
    reader = Inbound(4096)
    reader.feed(frame(PING, b"x"))
    assert reader.idle
    whole = frame(TEXT, b"abc")
    reader.feed(whole[:4])
    assert not reader.idle  # a frame partly read
    reader.feed(whole[4:])
    assert reader.idle
    reader.feed(frame(TEXT, b"a", fin=False))
    assert not reader.idle  # a fragmented message in flight
    reader.feed(frame(CONT, b"b"))
    assert reader.idle
