"""The daemon's hand-built text frames are exactly what the websockets library
builds, and what its parser reads back, at every length encoding."""

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from daemon.wire import text_frame


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_matches_the_library_byte_for_byte(size):
    payload = bytes(i % 251 for i in range(size))
    built = text_frame(payload)
    assert built == Frame(Opcode.TEXT, payload).serialize(mask=False)
    reader = StreamReader()
    reader.feed_data(built)
    parser = Frame.parse(reader.read_exact, mask=False)
    with pytest.raises(StopIteration) as done:
        next(parser)
    frame = done.value.value
    assert (frame.opcode, frame.fin, frame.data) == (Opcode.TEXT, True, payload)
