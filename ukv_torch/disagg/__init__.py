"""Disaggregated prefill and decode: a sequence's KV moves from a prefill
engine's pool straight into a decode engine's over Mooncake's transfer
engine (docs/serving-loop.md, "Prefill and decode on different engines").

`TransferEndpoint` (endpoint.py) is one process's transfer engine;
`KvSender` (sender.py) and `KvReceiver` (receiver.py) the two sides; the
messages between them travel on a `Channel` (channel.py); `KvRegions`
(kv_regions.py) maps the transfer buffer's offsets to each side's rows.
Mooncake is an optional extra: only creating a TransferEndpoint imports it.
"""
from .channel import Channel, ChannelClosed
from .endpoint import TransferEndpoint
from .kv_regions import KvRegions
from .receiver import Abort, Arrival, KvReceiver
from .sender import KvSender, SendResult

__all__ = ["Abort", "Arrival", "Channel", "ChannelClosed", "KvReceiver", "KvRegions", "KvSender", "SendResult",
           "TransferEndpoint"]
