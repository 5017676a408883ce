"""The host side of host_callback: queues, threads and bytes (no JAX tracing).

Installed as `host_callback.receiver`.
"""

from .errors import CallbackException, ErrorLog
from .packets import POLL_SECONDS, Packet, ReceiverStopped, Reply
from .queues import PacketQueue
from .consumer_threads import Receiver, in_consumer_thread
from .registry import Consumer, ConsumerRegistry
from .lifecycle import Runtime
from .transport import Producer, QueueStats, Transport
from .transport_python import PythonTransport

__all__ = [
    "POLL_SECONDS", "CallbackException", "Consumer", "ConsumerRegistry", "ErrorLog", "Packet",
    "PacketQueue", "Producer", "PythonTransport", "QueueStats", "Receiver",
    "ReceiverStopped", "Reply", "Runtime", "Transport", "in_consumer_thread",
]
