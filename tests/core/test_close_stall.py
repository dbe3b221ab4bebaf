"""A WebSocket being closed keeps flushing for as long as its client reads,
and one whose client reads nothing is cut off after the close stall
(``close_stall_seconds``, or the ping timeout if longer),
on a transport that reports its unsent bytes as the test says. The stall is
shortened here; the check it schedules is the daemon's."""


from chat.errors import CloseCode
from chat.settings import DaemonSettings, Settings
from daemon import connection
from daemon.connection import Connection, ServerState
from daemon.wire import close_frame
from tests.timing import eventually

STALL = 0.02


class Unsent:
    """A transport whose unsent bytes are, at each look, the next of ``sizes`` (the last one stays)."""

    def __init__(self, *sizes: int):
        self.sizes, self.looks, self.written = list(sizes), 0, []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        return self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]


class Forgets:
    def forget(self, conn) -> None:
        pass


def closing(transport: Unsent, ping_timeout: float = 0.01) -> Connection:
    settings = Settings(_env_file=None,
                        daemon=DaemonSettings(ping_timeout_seconds=ping_timeout, close_stall_seconds=STALL))
    conn = Connection(ServerState(settings), Forgets())  # type: ignore[arg-type]
    conn.transport = transport  # type: ignore[assignment]
    conn.http = None
    conn.close(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect with since")
    return conn


async def test_a_client_that_reads_nothing_of_its_close_is_cut_off_after_the_stall():
    transport = Unsent(70_000)  # the close frame behind 70 KB it never takes
    closing(transport)
    assert transport.written == [close_frame(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect with since")]
    assert transport.closed and not transport.aborted  # the close is flushing, for now
    await eventually(lambda: transport.aborted, "the stalled connection is aborted")
    assert transport.looks == 2  # at the close, then once after one stall: nothing was read in it


async def test_a_client_that_keeps_reading_gets_its_close_however_long_it_takes():
    transport = Unsent(70_000, 50_000, 30_000, 29_000, 1, 0)  # a little read in every stall, then all
    closing(transport)
    await eventually(lambda: transport.looks == 6, "the close flushed, looked at once a stall")
    assert not transport.aborted


async def test_a_close_flushed_at_once_is_left_alone():
    transport = Unsent(0)
    closing(transport)
    assert transport.closed and transport.looks == 1
    assert not transport.aborted


def test_the_stall_is_never_shorter_than_the_ping_timeout(monkeypatch):
    periods = []
    monkeypatch.setattr(connection, "_reap_if_stalled", lambda transport, period, unsent: periods.append(period))
    closing(Unsent(1))  # a ping timeout shorter than the stall
    closing(Unsent(1), ping_timeout=STALL * 3)
    assert periods == [STALL, STALL * 3]
