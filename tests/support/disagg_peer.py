"""One side of a transfer in its own process, for the tests where a side
dies or hangs: run as ``python disagg_peer.py ROLE ...`` (tests/support/disagg.py
starts it).

- ``receiver-dies``: a receiver that prints ``READY host port`` and exits
  the moment it has answered an offer, before any byte lands.
- ``receiver-hangs STAGING_BYTES``: a receiver that prints ``READY host
  port``, answers an offer and the sender's ping, and from then on never
  reads or answers again (its transfer engine still takes bytes) until it is
  killed.
- ``sender-dies HOST PORT``: a sender that offers a prefilled sequence to
  that receiver, writes half of its first piece, and exits.
- ``sender-hangs HOST PORT``: a sender that offers a prefilled sequence to
  that receiver, says its first piece was written, and from then on neither
  writes nor says anything until it is killed.
- ``sender-freezes HOST PORT``: a sender that offers a prefilled sequence to
  that receiver and stops itself with SIGSTOP once its transfer engine holds
  the writes of the second piece: the whole process at once, the engine's
  threads too (its sockets still take connections and bytes up to their
  buffers, but nothing reads or answers), until it is killed.
- ``receiver-serves``: a receiver that prints ``READY host port`` and takes
  transfers in full (a test stops it with SIGSTOP when it wants).
"""
import os
import signal
import sys
import time

from disagg_pools import pool, prefill, prompt

from ukv_torch.disagg import Channel, KvReceiver, KvSender, TransferEndpoint

DIED = 3
#: long past any timeout of the side that waits on this one: the test kills it first
HUNG_S = 600


def receiver(on_offer, staging_bytes: int = 0) -> None:
    """on_offer(await_pieces, channel, move) runs once the receiver answered an offer."""
    side = pool("elastic")
    receiver = KvReceiver(side.mgr, side.plan, side.kv, TransferEndpoint(), timeout_s=30,
                          staging_bytes=staging_bytes)
    await_pieces = receiver._await_pieces
    receiver._await_pieces = lambda *args: on_offer(await_pieces, *args)
    print("READY", *receiver.address, flush=True)
    for _ in range(600):  # at most a minute without an offer
        receiver.poll(0.1)
    sys.exit(1)


def pong_then_hang(channel: Channel) -> None:
    ping = channel.receive(30)
    assert ping["type"] == "ping", ping
    channel.pong(ping)
    time.sleep(HUNG_S)


def sender(host: str, port: int, endpoint: TransferEndpoint) -> None:
    side = pool("row_space", seed=1)
    prefill(side, 1, prompt(700))
    KvSender(side.mgr, side.plan, side.kv, endpoint, timeout_s=30).send(1, (host, port), 5)
    sys.exit(1)


def sender_dies(host: str, port: int) -> None:
    endpoint = TransferEndpoint()
    submit = endpoint.submit

    def half_then_die(peer, writes):
        submit(peer, writes[: max(1, len(writes) // 2)]).wait(30)
        os._exit(DIED)

    endpoint.submit = half_then_die
    sender(host, port, endpoint)


def sender_freezes(host: str, port: int) -> None:
    endpoint = TransferEndpoint()
    submit = endpoint.submit
    pieces = []

    def freeze_at_the_second_piece(peer, writes):
        pieces.append(submit(peer, writes))
        if len(pieces) == 2:
            while not pieces[1].submitted:  # until the engine holds some of its writes
                pieces[1].done()
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGSTOP)
        return pieces[-1]

    endpoint.submit = freeze_at_the_second_piece
    sender(host, port, endpoint)


def sender_hangs(host: str, port: int) -> None:
    send = Channel.send

    def hang_after_the_first_piece(channel, message):
        send(channel, message)
        if message["type"] == "written":
            time.sleep(HUNG_S)

    Channel.send = hang_after_the_first_piece
    sender(host, port, TransferEndpoint())


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "receiver-dies":
        receiver(lambda *args: os._exit(DIED))
    elif role == "receiver-hangs":
        receiver(lambda await_pieces, channel, move: pong_then_hang(channel), int(sys.argv[2]))
    elif role == "receiver-serves":
        receiver(lambda await_pieces, *args: await_pieces(*args))
    elif role == "sender-dies":
        sender_dies(sys.argv[2], int(sys.argv[3]))
    elif role == "sender-freezes":
        sender_freezes(sys.argv[2], int(sys.argv[3]))
    else:
        sender_hangs(sys.argv[2], int(sys.argv[3]))
