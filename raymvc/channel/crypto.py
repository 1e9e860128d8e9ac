"""Key agreement and authenticated encryption for channel links.

Each party owns an X25519 key pair. After two parties swap public keys, both derive
the same 32-byte shared secret and expand it with HKDF-SHA256 into two AES-256 keys,
one per direction: the ``info`` string names the sender and the receiver, so the key
for ``a -> b`` never equals the key for ``b -> a``. Frames are sealed with AES-256-GCM;
the 12-byte nonce is built from the per-link sequence number, which never repeats for
one directional key.

``cryptography`` is imported when a key is first made, so a run without encryption does not
load it.
"""

from __future__ import annotations

import struct

ENCRYPTIONS = ("none", "aes-gcm")
PUBLIC_KEY_BYTES = 32
TAG_BYTES = 16
_INFO_PREFIX = b"raymvc link v1|"

__all__ = [
    "ENCRYPTIONS", "PUBLIC_KEY_BYTES", "TAG_BYTES", "TagMismatch", "LinkKeys",
    "generate_private_key", "public_bytes", "derive_link_keys", "seq_nonce",
    "handshake_bytes",
]


def handshake_bytes(encryption: str) -> int:
    """Bytes of one public-key announcement under ``encryption`` (for metering setup)."""
    if encryption not in ENCRYPTIONS:
        raise ValueError(f"encryption must be one of {ENCRYPTIONS}, got {encryption!r}")
    return PUBLIC_KEY_BYTES if encryption == "aes-gcm" else 0


class TagMismatch(ValueError):
    """A sealed frame failed authentication (wrong key, or altered on the way)."""


def generate_private_key():
    """Return a fresh X25519 private key."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return X25519PrivateKey.generate()


def public_bytes(private_key) -> bytes:
    """Return the raw 32-byte public key of ``private_key``."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _hkdf(secret: bytes, src: str, dst: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = _INFO_PREFIX + src.encode("utf-8") + b"->" + dst.encode("utf-8")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


class LinkKeys:
    """The two AES-256-GCM ciphers of one link: ``send`` (me -> peer), ``recv`` (peer -> me)."""

    __slots__ = ("send", "recv")

    def __init__(self, send_key: bytes, recv_key: bytes):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.send = AESGCM(send_key)
        self.recv = AESGCM(recv_key)

    def seal(self, seq: int, body: bytes, header: bytes) -> bytes:
        """``body`` encrypted for the peer, ``header`` authenticated with it."""
        return self.send.encrypt(seq_nonce(seq), body, header)

    def unseal(self, seq: int, body: bytes, header: bytes) -> bytes:
        """The peer's ``body`` decrypted; :class:`TagMismatch` if it fails authentication."""
        from cryptography.exceptions import InvalidTag

        try:
            return self.recv.decrypt(seq_nonce(seq), body, header)
        except InvalidTag:
            raise TagMismatch("authentication failed") from None


def derive_link_keys(private_key, me: str, peer: str, peer_public: bytes) -> LinkKeys:
    """Agree on a secret with ``peer`` and derive both directional keys.

    Raises ``ValueError`` if ``peer_public`` is not a valid 32-byte X25519 key.
    """
    if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != PUBLIC_KEY_BYTES:
        raise ValueError(f"peer {peer!r}: public key must be {PUBLIC_KEY_BYTES} raw bytes")
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    secret = private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    return LinkKeys(_hkdf(secret, me, peer), _hkdf(secret, peer, me))


def seq_nonce(seq: int) -> bytes:
    """12-byte GCM nonce for sequence number ``seq`` (4 zero bytes + uint64 big-endian)."""
    return struct.pack(">IQ", 0, seq)
