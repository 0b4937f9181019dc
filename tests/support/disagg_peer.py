"""One side of a transfer in its own process, for the tests where a side
dies: run as ``python disagg_peer.py ROLE ...`` (tests/support/disagg.py
starts it).

- ``receiver-dies``: a receiver that prints ``READY host port`` and exits
  the moment it has answered an offer, before any byte lands.
- ``sender-dies HOST PORT``: a sender that offers a prefilled sequence to
  that receiver, writes half of its rows, and exits.
"""
import os
import sys

from disagg_pools import pool, prefill, prompt

from ukv_torch.disagg import KvReceiver, KvSender, TransferEndpoint

DIED = 3


def receiver_dies() -> None:
    side = pool("elastic")
    receiver = KvReceiver(side.mgr, side.plan, side.kv, TransferEndpoint(), timeout_s=30)
    receiver._await_done = lambda *args: os._exit(DIED)
    print("READY", *receiver.address, flush=True)
    for _ in range(600):  # at most a minute without an offer
        receiver.poll(0.1)
    sys.exit(1)


def sender_dies(host: str, port: int) -> None:
    side = pool("row_space", seed=1)
    prefill(side, 1, prompt(700))
    endpoint = TransferEndpoint()
    write = endpoint.write

    def half_then_die(peer, writes):
        write(peer, writes[: max(1, len(writes) // 2)])
        os._exit(DIED)

    endpoint.write = half_then_die
    KvSender(side.mgr, side.plan, side.kv, endpoint, timeout_s=30).send(1, (host, port), 5)
    sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "receiver-dies":
        receiver_dies()
    else:
        sender_dies(sys.argv[2], int(sys.argv[3]))
