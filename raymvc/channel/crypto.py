"""Key agreement and authenticated encryption for channel links.

Each party owns an X25519 key pair. After two parties swap public keys, both derive
the same 32-byte shared secret and expand it with HKDF-SHA256 into two AES-256 keys,
one per direction: the ``info`` string names the sender and the receiver, so the key
for ``a -> b`` never equals the key for ``b -> a``. Frames are sealed with AES-256-GCM;
the 12-byte nonce is built from the per-link sequence number, which never repeats for
one directional key.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ENCRYPTIONS = ("none", "aes-gcm")
PUBLIC_KEY_BYTES = 32
TAG_BYTES = 16
_INFO_PREFIX = b"raymvc link v1|"

__all__ = [
    "ENCRYPTIONS", "PUBLIC_KEY_BYTES", "TAG_BYTES", "InvalidTag", "LinkKeys",
    "generate_private_key", "public_bytes", "derive_link_keys", "seq_nonce",
    "handshake_bytes",
]


def handshake_bytes(encryption: str) -> int:
    """Bytes of one public-key announcement under ``encryption`` (for metering setup)."""
    if encryption not in ENCRYPTIONS:
        raise ValueError(f"encryption must be one of {ENCRYPTIONS}, got {encryption!r}")
    return PUBLIC_KEY_BYTES if encryption == "aes-gcm" else 0


def generate_private_key() -> X25519PrivateKey:
    """Return a fresh X25519 private key."""
    return X25519PrivateKey.generate()


def public_bytes(private_key: X25519PrivateKey) -> bytes:
    """Return the raw 32-byte public key of ``private_key``."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _hkdf(secret: bytes, src: str, dst: str) -> bytes:
    info = _INFO_PREFIX + src.encode("utf-8") + b"->" + dst.encode("utf-8")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


class LinkKeys:
    """The two AES-256-GCM ciphers of one link: ``send`` (me -> peer), ``recv`` (peer -> me)."""

    __slots__ = ("send", "recv")

    def __init__(self, send_key: bytes, recv_key: bytes):
        self.send = AESGCM(send_key)
        self.recv = AESGCM(recv_key)


def derive_link_keys(private_key: X25519PrivateKey, me: str, peer: str,
                     peer_public: bytes) -> LinkKeys:
    """Agree on a secret with ``peer`` and derive both directional keys.

    Raises ``ValueError`` if ``peer_public`` is not a valid 32-byte X25519 key.
    """
    if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != PUBLIC_KEY_BYTES:
        raise ValueError(f"peer {peer!r}: public key must be {PUBLIC_KEY_BYTES} raw bytes")
    secret = private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    return LinkKeys(_hkdf(secret, me, peer), _hkdf(secret, peer, me))


def seq_nonce(seq: int) -> bytes:
    """12-byte GCM nonce for sequence number ``seq`` (4 zero bytes + uint64 big-endian)."""
    return struct.pack(">IQ", 0, seq)
