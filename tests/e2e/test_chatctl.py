"""`chatctl send` and `chatctl listen`, `edit`, `delete`, `read` and `ack`, `device`, and `typing` and
`presence`, as a developer runs them, against real servers: what each prints, and what MySQL holds after.
(`chatctl listen` behind a front door of two partitions: test_partitioned_delivery.py.)"""

import subprocess
import sys

import httpx
import orjson
from sqlalchemy import create_engine, text
from websockets.sync.client import connect

from harness.servers import ROOT
from tests.e2e.helpers import mysql_rows
from tests.frame_contract import violations
from tests.timing import PATIENCE, eventually_sync


def chatctl(system, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatctl.cli", *args], env=system.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=PATIENCE)


def stored(system, sender: str, to: str, body: str) -> dict:
    """The stored message of a POST /v1/messages (as `chatctl send` prints it)."""
    reply = httpx.post(f"{system.api_url}/v1/messages", json={"to": to, "body": body},
                       headers={"Authorization": f"Bearer {system.token(sender)}"}, timeout=PATIENCE)
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_chatctl_send_then_listen_resumes_from_since(system, users):
    alice, bob = users("alice"), users("bob")
    first = chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "one", "--client-msg-id", "k1")
    assert first.returncode == 0, first.stderr
    stored = orjson.loads(first.stdout)
    again = chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "one", "--client-msg-id", "k1")
    assert orjson.loads(again.stdout) == stored  # a retry stores nothing new
    second = orjson.loads(chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "two").stdout)

    listened = chatctl(system, "listen", "--as", bob, "--url", system.ws_url, "--since", str(int(stored["id"]) - 1),
                       "--count", "2")
    assert listened.returncode == 0, listened.stderr
    assert [orjson.loads(line) for line in listened.stdout.splitlines()] == [stored, second]


def test_chatctl_send_refused_exits_non_zero(system, users):
    refused = chatctl(system, "send", "--as", users("alice"), "--api", system.api_url, "not a user", "x")
    assert refused.returncode == 1 and orjson.loads(refused.stdout)["field"] == "to"


def test_chatctl_listen_mints_a_new_token_when_its_own_expires_and_resumes(system, users, tmp_path):
    alice, bob = users("alice"), users("bob")
    first = stored(system, alice, bob, "one")
    out, err = tmp_path / "listen.out", tmp_path / "listen.err"
    # Tokens of a second: the daemon closes the socket with 4001 within its heartbeat tick (a second) of exp.
    with open(out, "w") as stdout, open(err, "w") as stderr:
        listening = subprocess.Popen(
            [sys.executable, "-m", "chatctl.cli", "listen", "--as", bob, "--url", system.ws_url,
             "--since", str(int(first["id"]) - 1), "--count", "2", "--token-ttl", "1s"],
            env=system.env, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
    try:
        eventually_sync(lambda: out.read_text().count("\n") >= 1, "chatctl listen printed the first message")
        # Sent once the daemon has closed the first socket: only a socket on a renewed token can carry it.
        eventually_sync(lambda: "token closed with 4001: minted a new one" in err.read_text(),
                        "chatctl listen renewed its token after the daemon's 4001")
        second = stored(system, alice, bob, "two")
        assert listening.wait(PATIENCE) == 0, err.read_text()
    finally:
        listening.kill()
        listening.wait()
    assert [orjson.loads(line) for line in out.read_text().splitlines()] == [first, second]


# Edits, deletes, read markers and delivery receipts (docs/receipts.md), as a user runs them.

def answer(done: subprocess.CompletedProcess) -> tuple[int, dict]:
    """A command's exit status and the JSON it printed."""
    return done.returncode, orjson.loads(done.stdout)


def listened(system, user: str, since: str, count: int, *more: str) -> list[str]:
    """What `chatctl listen --as user --since since --count count` printed, line by line; as JSON,
    each frame as the AsyncAPI document has it (the process's frames are not the in-process check's)."""
    done = chatctl(system, "listen", "--as", user, "--url", system.ws_url, "--since", since, "--count", str(count),
                   *more)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    if "--format" not in more:
        assert [v for line in lines for v in violations(orjson.loads(line))] == []
    return lines


def sql(system, query: str, **params) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text(query), params).all()
    finally:
        engine.dispose()


def conversations(system, user: str) -> dict[str, dict]:
    reply = httpx.get(f"{system.api_url}/v1/conversations", headers={"Authorization": f"Bearer {system.token(user)}"},
                      timeout=PATIENCE)
    assert reply.status_code == 200, reply.text
    return {c["with"]: c for c in reply.json()["conversations"]}


def test_chatctl_edit_then_delete_reach_the_peer_as_events_and_leave_a_tombstone(system, users):
    alice, bob = users("alice"), users("bob")
    sent = stored(system, alice, bob, "one")
    api = ("--api", system.api_url)

    status, edited = answer(chatctl(system, "edit", "--as", alice, *api, sent["id"], "one, edited",
                                    "--client-msg-id", "e1"))
    assert status == 0 and edited == {**edited, "type": "edit", "from": alice, "to": bob, "ref": sent["id"],
                                      "body": "one, edited", "client_msg_id": "e1"}
    assert int(edited["id"]) > int(sent["id"])
    assert answer(chatctl(system, "edit", "--as", alice, *api, sent["id"], "one, edited", "--client-msg-id", "e1")) \
        == (0, edited)  # a retry stores nothing new
    status, refused = answer(chatctl(system, "edit", "--as", bob, *api, sent["id"], "not mine"))
    assert status == 1 and refused["error"] == "not_sender"

    status, deleted = answer(chatctl(system, "delete", "--as", alice, *api, sent["id"]))
    assert status == 0 and deleted == {**deleted, "type": "delete", "from": alice, "to": bob, "ref": sent["id"],
                                       "client_msg_id": None}
    for again in (("delete", "--as", alice, *api, sent["id"]), ("edit", "--as", alice, *api, sent["id"], "back")):
        status, refused = answer(chatctl(system, *again))
        assert status == 1 and refused["error"] == "message_deleted"

    # Bob, from before the message: the message as it is now (a tombstone), then the two events.
    since = str(int(sent["id"]) - 1)
    tombstone, *events = [orjson.loads(line) for line in listened(system, bob, since, 3)]
    assert events == [edited, deleted]
    assert tombstone == {**sent, "body": "", "deleted": True, "edited_at": tombstone["edited_at"]}
    assert listened(system, bob, since, 3, "--format", "text") == [
        f"connected as {bob}, 0 unread",
        f"#{sent['id']} {sent['created_at']} {alice} -> {bob}: (deleted)",
        f"#{edited['id']} {edited['created_at']} {alice} edited #{sent['id']}: one, edited",
        f"#{deleted['id']} {deleted['created_at']} {alice} deleted #{sent['id']}",
    ]
    # In MySQL: the message's latest version, and each event a row of the stream naming it.
    message, *rows = mysql_rows(system, "sender = :s", s=alice)
    assert (message.id, message.kind, bool(message.deleted), message.edited_at is not None) == (
        int(sent["id"]), 0, True, True)
    assert [(r.id, r.kind, r.ref_id, r.body, r.recipient) for r in rows] == [
        (int(edited["id"]), 1, int(sent["id"]), "one, edited", bob), (int(deleted["id"]), 2, int(sent["id"]), "", bob)]


def test_chatctl_read_moves_the_marker_the_peer_is_told_and_the_unread_count(system, users):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    first, second = stored(system, alice, bob, "one"), stored(system, alice, bob, "two")
    other = stored(system, carol, bob, "hi")  # another conversation's unread message
    api = ("--api", system.api_url)

    assert answer(chatctl(system, "read", "--as", bob, *api, alice, first["id"])) == (
        0, {"peer": alice, "upto": first["id"], "unread": 1})
    for upto, code in [(other["id"], "not_in_conversation"), (str(2**63 - 1), "past_newest"),
                       ("nine", "invalid_field")]:
        status, refused = answer(chatctl(system, "read", "--as", bob, *api, alice, upto))
        assert status == 1 and refused["error"] == code, refused
    assert answer(chatctl(system, "read", "--as", bob, *api, alice, second["id"])) == (
        0, {"peer": alice, "upto": second["id"], "unread": 0})
    # An older marker changes nothing: the same answer, and no event.
    assert answer(chatctl(system, "read", "--as", bob, *api, alice, first["id"])) == (
        0, {"peer": alice, "upto": second["id"], "unread": 0})

    # Alice is told of each marker that moved, in her stream after her messages.
    reads = [orjson.loads(line) for line in listened(system, alice, second["id"], 2)]
    assert [(r["type"], r["from"], r["to"], r["upto"]) for r in reads] == [
        ("read", bob, alice, first["id"]), ("read", bob, alice, second["id"])]
    # Bob's other devices too, after carol's message: his one unread message.
    assert listened(system, bob, second["id"], 3, "--format", "text") == [
        f"connected as {bob}, 1 unread",
        f"#{other['id']} {other['created_at']} {carol} -> {bob}: hi",
        *(f"#{r['id']} {r['created_at']} {bob} read {alice}'s messages up to #{r['upto']}" for r in reads),
    ]
    mine, theirs = conversations(system, bob), conversations(system, alice)[bob]
    assert (mine[alice]["unread"], mine[alice]["read_upto"], mine[carol]["unread"], mine[carol]["read_upto"]) == (
        0, second["id"], 1, None)
    assert theirs["peer_read_upto"] == second["id"] and theirs["read_upto"] is None
    assert [tuple(r) for r in sql(system, "SELECT reader, peer, upto FROM read_markers WHERE reader = :u", u=bob)] \
        == [(bob, alice, int(second["id"]))]


def test_chatctl_ack_tells_the_sender_its_messages_were_delivered(system, users):
    alice, bob = users("alice"), users("bob")
    sent = stored(system, alice, bob, "one")
    api = ("--api", system.api_url)

    assert answer(chatctl(system, "ack", "--as", bob, *api, sent["id"], "--device", "phone-1")) == (
        0, {"device": "phone-1", "upto": sent["id"]})
    # An older ack leaves the device's position where it was.
    assert answer(chatctl(system, "ack", "--as", bob, *api, str(int(sent["id"]) - 1), "--device", "phone-1")) == (
        0, {"device": "phone-1", "upto": sent["id"]})
    assert answer(chatctl(system, "ack", "--as", bob, *api, sent["id"])) == (
        0, {"device": "default", "upto": sent["id"]})
    status, refused = answer(chatctl(system, "ack", "--as", bob, *api, str(2**63 - 1)))
    assert status == 1 and refused["error"] == "past_newest"

    # Alice hears it once, whichever device said so first: one event, then the next message bob sends.
    after = stored(system, bob, alice, "after")
    delivered, then = [orjson.loads(line) for line in listened(system, alice, sent["id"], 2)]
    assert delivered == {**delivered, "type": "delivered", "from": bob, "to": alice, "upto": sent["id"]}
    assert then == after
    assert listened(system, alice, sent["id"], 2, "--format", "text") == [
        f"connected as {alice}, 1 unread",
        f"#{delivered['id']} {delivered['created_at']} {bob} received {alice}'s messages up to #{sent['id']}",
        f"#{after['id']} {after['created_at']} {bob} -> {alice}: after"]
    assert conversations(system, alice)[bob]["peer_delivered_upto"] == sent["id"]
    assert sorted(tuple(r) for r in sql(system, "SELECT device, upto FROM device_acks WHERE user = :u", u=bob)) == [
        ("default", int(sent["id"])), ("phone-1", int(sent["id"]))]


# Push devices (api/devices.py), as a user registers, lists and removes them.

def test_chatctl_device_register_list_and_remove(system, users):
    bob, carol = users("bob"), users("carol")
    api = ("--api", system.api_url)
    register = ("device", "register", "--as", bob, *api, "phone-1", "--platform", "android", "--app-id",
                "chat.example")

    status, phone = answer(chatctl(system, *register, "--pushkey", "pk-1", "--data",
                                   '{"url": "https://push.example/notify"}'))
    assert status == 0 and phone == {"device": "phone-1", "platform": "android", "app_id": "chat.example",
                                     "pushkey": "pk-1", "data": {"url": "https://push.example/notify"},
                                     "created_at": phone["created_at"]}
    # Registered again: the same device with its new token, registered when it first was.
    status, renewed = answer(chatctl(system, *register, "--pushkey", "pk-2"))
    assert status == 0 and renewed == {**phone, "pushkey": "pk-2", "data": {}}
    status, laptop = answer(chatctl(system, "device", "register", "--as", bob, *api, "laptop", "--platform", "web",
                                    "--app-id", "chat.web", "--pushkey", "https://push.example/s/1"))
    assert status == 0
    assert answer(chatctl(system, "device", "list", "--as", bob, *api)) == (0, {"devices": [renewed, laptop]})
    assert answer(chatctl(system, "device", "list", "--as", carol, *api)) == (0, {"devices": []})

    for field, options in (("platform", ("--platform", "IOS", "--app-id", "a", "--pushkey", "k")),
                           ("data", ("--platform", "ios", "--app-id", "a", "--pushkey", "k", "--data", "[1]"))):
        status, refused = answer(chatctl(system, "device", "register", "--as", bob, *api, "tablet", *options))
        assert status == 1 and (refused["error"], refused["field"]) == ("invalid_field", field), refused

    removed = chatctl(system, "device", "remove", "--as", bob, *api, "phone-1")
    assert (removed.returncode, removed.stdout) == (0, ""), removed.stderr
    status, gone = answer(chatctl(system, "device", "remove", "--as", bob, *api, "phone-1"))
    assert status == 1 and gone["error"] == "device_not_found"
    status, refused = answer(chatctl(system, "device", "remove", "--as", carol, *api, "laptop"))
    assert status == 1 and refused["error"] == "device_not_found"  # bob's, not carol's
    status, refused = answer(chatctl(system, "device", "remove", "--as", bob, *api, "a b"))
    assert status == 1 and (refused["error"], refused["field"]) == ("invalid_field", "device")
    # `.` and `..` are no device ids: a URL path cannot carry them to DELETE /v1/devices/{device}.
    for dots in (".", ".."):
        status, refused = answer(chatctl(system, "device", "register", "--as", bob, *api, dots, "--platform",
                                         "ios", "--app-id", "a", "--pushkey", "k"))
        assert status == 1 and (refused["error"], refused["field"]) == ("invalid_field", "device"), dots
    assert [tuple(r) for r in sql(system, "SELECT device, pushkey FROM devices WHERE user = :u", u=bob)] == [
        ("laptop", "https://push.example/s/1")]


# Typing and presence (docs/presence.md): signals, as a developer follows and sends them.

class Listening:
    """`chatctl listen` running in the background; what it printed so far, line by line."""

    def __init__(self, system, tmp_path, name: str, *args: str):
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(self.out, "w") as stdout, open(self.err, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "chatctl.cli", "listen", *args], env=system.env,
                                         cwd=ROOT, stdout=stdout, stderr=stderr, text=True)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def until(self, found, what: str) -> str:
        """The first line ``found(line)`` holds for, once printed."""
        def look() -> str | None:
            assert self.proc.poll() is None, self.err.read_text()
            return next((line for line in self.lines() if found(line)), None)
        return eventually_sync(look, f"chatctl listen printed {what}")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_chatctl_listen_shows_typing_and_the_presence_of_whom_it_watches(system, users, tmp_path):
    alice, bob = users("alice"), users("bob")
    api = ("--api", system.api_url)
    following = ("--as", bob, "--url", system.ws_url, "--watch", alice)
    shown = Listening(system, tmp_path, "text", *following, "--format", "text")
    frames = Listening(system, tmp_path, "json", *following)
    try:
        shown.until(lambda line: line == f"watching: {alice} offline", "the snapshot: alice never seen")
        frames.until(lambda line: '"presence"' in line, "the snapshot as JSON")
        with connect(f"{system.ws_url}/v1/ws", additional_headers={"Authorization": f"Bearer {system.token(alice)}"}) \
                as ws:
            assert orjson.loads(ws.recv(PATIENCE))["type"] == "hello"
            shown.until(lambda line: line == f"{alice} is online", "alice online")

            assert answer(chatctl(system, "typing", "--as", alice, *api, bob)) == (0, {"sent": True})
            shown.until(lambda line: line == f"{alice} is typing to {bob} (5 s)", "alice typing")
            # her other connection is told too
            assert orjson.loads(ws.recv(PATIENCE)) == {"type": "typing", "from": alice, "to": bob, "state": "start",
                                                      "ttl": 5}
            assert answer(chatctl(system, "typing", "--as", alice, *api, bob, "--stop")) == (0, {"sent": True})
            shown.until(lambda line: line == f"{alice} stopped typing to {bob}", "alice stopped")

            status, seen = answer(chatctl(system, "presence", "--as", bob, *api, alice, bob))
            assert status == 0 and seen == {"users": [{"user": alice, "online": True, "last_seen": None},
                                                      {"user": bob, "online": True, "last_seen": None}]}
        # Her only connection closed: offline once the grace (CHAT_PRESENCE_GRACE_SECONDS) has passed.
        gone = shown.until(lambda line: line.startswith(f"{alice} is offline, last seen "), "alice offline")
        frames.until(lambda line: '"online":false' in line and '"last_seen":"' in line, "alice offline as JSON")
    finally:
        shown.stop()
        frames.stop()
    status, seen = answer(chatctl(system, "presence", "--as", bob, *api, f"{alice},{bob}"))
    assert status == 0 and seen["users"][0] == {"user": alice, "online": False,
                                                "last_seen": gone.removeprefix(f"{alice} is offline, last seen ")}
    printed = [orjson.loads(line) for line in frames.lines()]
    assert [v for frame in printed for v in violations(frame)] == []
    assert [f["type"] for f in printed] == ["presence", "presence", "typing", "typing", "presence"]


def test_chatctl_typing_and_presence_refusals_exit_non_zero(system, users):
    alice = users("alice")
    api = ("--api", system.api_url)
    status, refused = answer(chatctl(system, "typing", "--as", alice, *api, "not a user"))
    assert status == 1 and refused["error"] == "invalid_field", refused
    status, refused = answer(chatctl(system, "presence", "--as", alice, *api, *(f"u{i}" for i in range(201))))
    assert status == 1 and refused["error"] == "invalid_field", refused
