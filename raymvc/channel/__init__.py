"""The channel every message travels through: codec, link layer (compression and
encryption) and the traffic ledger."""

from .codec import CodecError, decode, encode
from .link import Encoded, Endpoint, Opened, RejectedMessage, Sealed, handshake_bytes
from .meter import Ledger, LedgerRow

__all__ = [
    "CodecError", "decode", "encode",
    "Encoded", "Endpoint", "Opened", "RejectedMessage", "Sealed", "handshake_bytes",
    "Ledger", "LedgerRow",
]
