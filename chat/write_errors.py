"""How a write can fail, as the writer raises it and the API answers it.

The writer of the API process itself and the host's writer process (through
writer/client.py) raise the same exceptions, so the POST route does not know
which one stored its message.
"""

from __future__ import annotations

from chat.errors import ChatError
from chat.messages import Message


class WriteUnavailable(ChatError):
    """MySQL is down, slow or locked past the timeout: nothing was stored."""

    kind = "mysql_unavailable"  # the error code of the API's 503


class WriteOutcomeUnknown(WriteUnavailable):
    """MySQL failed during the commit itself and could not be asked afterwards
    whether it took: the messages may be stored. A retry with the same
    client_msg_id returns them if so, and stores them once if not."""


class WriterOverloaded(ChatError):
    """More requests are queued than the writer accepts: nothing was stored."""


class ClientIdConflict(ChatError):
    """The sender reused a client_msg_id for a different message."""

    def __init__(self, original: Message):
        super().__init__("client_msg_id already used for a different message")
        self.original = original
