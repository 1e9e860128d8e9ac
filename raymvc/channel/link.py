"""The link layer: turn messages into frames and back, checking every frame.

A frame is::

    b"RMF1" | flags (1 byte) | src | dst | round (int32 LE) | seq (uint64 LE) | body

where ``src`` and ``dst`` are UTF-8 party ids prefixed by their uint16 LE length,
flag bit 0 means the body is zlib-compressed and bit 1 that it is AES-256-GCM
encrypted. The body is the codec encoding of the message, compressed, then encrypted
with every frame byte before it as associated data, so sender, receiver, round and
sequence number cannot be altered without the tag failing.

A sealed frame keeps its header and body apart (:class:`Sealed`), and
:meth:`Endpoint.open` takes either the joined bytes or the ``(header, body)`` pair.
A message sent to several peers is encoded and compressed once (:meth:`Endpoint.encode`,
then ``seal(..., encoded=...)``); without encryption every recipient's frame then shares
one body object, which the Ray transport puts in the object store once.

:meth:`Endpoint.open` never processes a frame it does not trust: it raises
:class:`RejectedMessage` with a ``reason`` and counts it in ``Endpoint.rejected``.
Every frame is bounded: one longer than ``max_message_bytes`` on the wire, or whose
compressed body would inflate past it, is rejected as ``oversized`` without being
inflated (the decompressor stops at the cap); so is one whose codec header is over the
codec's limits (:data:`~raymvc.channel.codec.MAX_HEADER_BYTES`,
:data:`~raymvc.channel.codec.MAX_FIELDS`), checked on a compressed body's first
inflated bytes. A receiver that knows whom it asked and
in which round (the server) passes ``expect_src`` and ``expect_round``; an answer
from another party is ``misrouted`` and one from another round ``stale-round``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ..messages import Message
from . import codec
from .crypto import (
    ENCRYPTIONS,
    TagMismatch,
    derive_link_keys,
    generate_private_key,
    handshake_bytes,
    public_bytes,
)

FRAME_MAGIC = b"RMF1"
FLAG_COMPRESSED = 0x01
FLAG_ENCRYPTED = 0x02
COMPRESSIONS = ("none", "zlib")
REASONS = ("malformed", "tampered", "replayed", "misrouted", "unknown-peer", "oversized",
           "stale-round")
DEFAULT_MAX_MESSAGE_MB = 256.0  # scenario key channel.max_message_mb (MB = 10**6 bytes)
MAX_PAYLOAD_BYTES = int(DEFAULT_MAX_MESSAGE_MB * 1_000_000)

_U16 = struct.Struct("<H")
_ROUND_SEQ = struct.Struct("<iQ")

__all__ = [
    "COMPRESSIONS", "ENCRYPTIONS", "REASONS", "Encoded", "Endpoint", "Opened", "RejectedMessage",
    "Sealed", "handshake_bytes",
]


class _Oversized(ValueError):
    """A body that would inflate past the cap (reported as ``oversized``)."""


class RejectedMessage(Exception):
    """A frame that was refused; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Encoded:
    """A message encoded and compressed once, ready to be sealed for any number of peers."""

    kind: str
    body: bytes  # codec output, compressed if the endpoint compresses
    payload_bytes: int  # codec output before compression
    data_bytes: int
    compressed: bool


@dataclass(frozen=True)
class Sealed:
    """A frame ready to send (header and body kept apart), with its size before and after
    the link layer."""

    header: bytes
    body: bytes
    payload_bytes: int
    wire_bytes: int
    kind: str
    seq: int
    data_bytes: int = 0

    @property
    def frame(self) -> bytes:
        """The frame as one byte string (``header + body``)."""
        return self.header + self.body

    @property
    def parts(self) -> tuple[bytes, bytes]:
        """``(header, body)``, what :meth:`Endpoint.open` also accepts."""
        return self.header, self.body


@dataclass(frozen=True)
class Opened:
    """A frame that passed every check, with its decoded message."""

    src: str
    dst: str
    round: int
    seq: int
    msg: Message
    payload_bytes: int
    data_bytes: int = 0


def _party_bytes(party: str) -> bytes:
    raw = party.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("party id too long")
    return _U16.pack(len(raw)) + raw


def _parse_frame(frame: bytes) -> tuple[int, str, str, int, int, int]:
    """Split a frame into (flags, src, dst, round, seq, body offset) or raise ValueError."""
    if len(frame) < len(FRAME_MAGIC) + 1 or frame[:4] != FRAME_MAGIC:
        raise ValueError("bad frame magic")
    flags = frame[4]
    if flags & ~(FLAG_COMPRESSED | FLAG_ENCRYPTED):
        raise ValueError(f"unknown frame flags {flags:#x}")
    pos = 5
    parties = []
    for _ in range(2):
        if len(frame) < pos + _U16.size:
            raise ValueError("frame header truncated")
        (n,) = _U16.unpack_from(frame, pos)
        pos += _U16.size
        if len(frame) < pos + n:
            raise ValueError("frame header truncated")
        parties.append(frame[pos:pos + n].decode("utf-8"))  # UnicodeDecodeError is a ValueError
        pos += n
    if len(frame) < pos + _ROUND_SEQ.size:
        raise ValueError("frame header truncated")
    rnd, seq = _ROUND_SEQ.unpack_from(frame, pos)
    pos += _ROUND_SEQ.size
    return flags, parties[0], parties[1], rnd, seq, pos


_BYTES = (bytes, bytearray, memoryview)


def _split(frame) -> tuple[object, object]:
    """``(header, body)`` of a frame given as a pair, ``(frame, None)`` for joined bytes,
    ``(None, None)`` for anything else; nothing is copied."""
    if isinstance(frame, _BYTES):
        return frame, None
    if isinstance(frame, tuple) and len(frame) == 2 and all(isinstance(p, _BYTES) for p in frame):
        return frame
    return None, None


def _nbytes(part) -> int:
    return 0 if part is None else part.nbytes if isinstance(part, memoryview) else len(part)


def _inflate(body: bytes, limit: int) -> bytes:
    """Inflate ``body``, producing at most ``limit + 1`` bytes whatever it claims; the
    codec prefix is inflated and checked first, so a header over the codec's limit is
    refused before the rest is inflated."""
    codec.check_header_length(zlib.decompressobj().decompress(body, codec.PREFIX_BYTES))
    d = zlib.decompressobj()
    out = d.decompress(body, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise _Oversized(f"decompressed payload exceeds the cap of {limit} bytes")
    if not d.eof or d.unused_data:
        raise ValueError("compressed body is truncated or has trailing bytes")
    return out


class Endpoint:
    """One party's end of all its links: seals outgoing and opens incoming frames.

    ``encryption`` is ``"none"`` or ``"aes-gcm"``, ``compression`` is ``"none"`` or
    ``"zlib"`` and ``float_dtype`` (``"float64"`` or ``"float32"``) is passed to the
    codec. ``max_message_bytes`` caps every incoming frame and its inflated payload
    (default 256 MB). Peers must be registered with :meth:`add_peer` before frames are
    exchanged.
    """

    def __init__(self, party: str, *, encryption: str = "none", compression: str = "none",
                 float_dtype: str = "float64", max_message_bytes: int = MAX_PAYLOAD_BYTES):
        if not isinstance(party, str) or not party:
            raise ValueError("party must be a non-empty string")
        if encryption not in ENCRYPTIONS:
            raise ValueError(f"encryption must be one of {ENCRYPTIONS}, got {encryption!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        if float_dtype not in codec.FLOAT_DTYPES:
            raise ValueError(f"float_dtype must be one of {codec.FLOAT_DTYPES}, "
                             f"got {float_dtype!r}")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) \
                or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be a positive int, got {max_message_bytes!r}")
        _party_bytes(party)
        self.party = party
        self.encryption = encryption
        self.compression = compression
        self.float_dtype = float_dtype
        self.max_payload_bytes = max_message_bytes  # cap on the frame and on the inflated payload
        self.rejected: dict[str, int] = {r: 0 for r in REASONS}
        self._private = generate_private_key() if encryption == "aes-gcm" else None
        self._keys: dict[str, object] = {}  # peer -> LinkKeys (or None without encryption)
        self._next_seq: dict[str, int] = {}  # peer -> next seq to send
        self._last_seq: dict[str, int] = {}  # peer -> highest seq accepted

    @property
    def encrypted(self) -> bool:
        return self.encryption == "aes-gcm"

    def public_key(self) -> bytes | None:
        """Raw 32-byte X25519 public key, or ``None`` without encryption."""
        return public_bytes(self._private) if self._private is not None else None

    def peers(self) -> list[str]:
        """Registered peer ids."""
        return list(self._keys)

    def add_peer(self, peer: str, public_key: bytes | None) -> None:
        """Register ``peer``; with aes-gcm derive the send and receive keys for it."""
        if not isinstance(peer, str) or not peer:
            raise ValueError("peer must be a non-empty string")
        _party_bytes(peer)
        if self.encrypted:
            if public_key is None:
                raise ValueError(f"peer {peer!r}: aes-gcm needs its public key")
            self._keys[peer] = derive_link_keys(self._private, self.party, peer, public_key)
        else:
            self._keys[peer] = None
        self._next_seq.setdefault(peer, 1)
        self._last_seq.setdefault(peer, 0)

    def encode(self, msg: Message) -> Encoded:
        """Encode and compress ``msg`` (no peer, no sequence number yet)."""
        payload = codec.encode(msg, self.float_dtype)
        compressed = self.compression == "zlib"
        return Encoded(kind=msg.kind, body=zlib.compress(payload) if compressed else payload,
                       payload_bytes=len(payload), data_bytes=codec.data_bytes(msg, self.float_dtype),
                       compressed=compressed)

    def seal(self, dst: str, round: int, msg: Message, *, encoded: Encoded | None = None) -> Sealed:
        """Encode, compress and encrypt ``msg`` for ``dst`` in ``round``.

        ``encoded`` (from :meth:`encode` of this endpoint, for this very message) skips
        the encoding: a broadcast is encoded once and sealed per recipient. Without
        encryption the frames then share the one body object.
        """
        if dst not in self._keys:
            raise KeyError(f"{self.party}: unknown peer {dst!r}; call add_peer first")
        if not -(2**31) <= round < 2**31:
            raise ValueError("round must fit in int32")
        if encoded is None:
            encoded = self.encode(msg)
        elif encoded.kind != msg.kind or encoded.compressed != (self.compression == "zlib"):
            raise ValueError("encoded was made for another message or endpoint")
        seq = self._next_seq[dst]
        self._next_seq[dst] = seq + 1
        flags = (FLAG_COMPRESSED if encoded.compressed else 0) | (FLAG_ENCRYPTED if self.encrypted else 0)
        header = (FRAME_MAGIC + bytes([flags]) + _party_bytes(self.party) + _party_bytes(dst)
                  + _ROUND_SEQ.pack(round, seq))
        body = encoded.body
        if self.encrypted:
            body = self._keys[dst].seal(seq, body, header)
        return Sealed(header=header, body=body, payload_bytes=encoded.payload_bytes,
                      wire_bytes=len(header) + len(body), kind=msg.kind, seq=seq, data_bytes=encoded.data_bytes)

    def _reject(self, reason: str, detail: str) -> RejectedMessage:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return RejectedMessage(reason, detail)

    def open(self, frame: bytes | tuple[bytes, bytes], *, expect_src: str | None = None,
             expect_round: int | None = None, pair_ok: bool = True) -> Opened:
        """Check and decode a frame (bytes, or the ``(header, body)`` pair of :attr:`Sealed.parts`);
        raise :class:`RejectedMessage` if it is not trusted.

        With ``expect_src`` a frame from any other party is ``misrouted``; with
        ``expect_round`` an authentic frame of another round is ``stale-round``;
        with ``pair_ok=False`` only joined bytes are accepted (a receiver that meters
        frames by their length).
        """
        header, body = _split(frame)
        if header is None or (body is not None and not pair_ok):
            raise self._reject("malformed", f"expected bytes{' or a (header, body) pair' if pair_ok else ''}, "
                                            f"got {type(frame).__name__}")
        try:
            size = _nbytes(header) + _nbytes(body)
            if size <= self.max_payload_bytes:
                header = bytes(header)  # no copy for bytes
                body = None if body is None else bytes(body)
        except ValueError as exc:  # e.g. a released memoryview
            raise self._reject("malformed", str(exc)) from None
        if size > self.max_payload_bytes:
            raise self._reject("oversized", f"frame of {size} bytes exceeds the cap of "
                                            f"{self.max_payload_bytes} bytes")
        try:
            flags, src, dst, rnd, seq, pos = _parse_frame(header)
            if body is not None and pos != len(header):
                raise ValueError("frame header has trailing bytes")
        except ValueError as exc:
            raise self._reject("malformed", str(exc)) from None
        if body is None:
            header, body = header[:pos], header[pos:]
        if dst != self.party:
            raise self._reject("misrouted", f"frame for {dst!r} reached {self.party!r}")
        if expect_src is not None and src != expect_src:
            raise self._reject("misrouted", f"expected a reply from {expect_src!r}, got one from {src!r}")
        if src not in self._keys:
            raise self._reject("unknown-peer", f"no link with {src!r}")
        if bool(flags & FLAG_ENCRYPTED) != self.encrypted:
            raise self._reject("tampered", "encryption flag does not match this link")
        if self.encrypted:
            try:
                body = self._keys[src].unseal(seq, body, header)
            except TagMismatch:
                raise self._reject("tampered", f"authentication failed for frame from {src!r}") \
                    from None
        if seq <= self._last_seq[src]:
            raise self._reject("replayed", f"seq {seq} from {src!r} already seen")
        if expect_round is not None and rnd != expect_round:
            raise self._reject("stale-round", f"frame of round {rnd} from {src!r} arrived in round "
                                              f"{expect_round}")
        try:
            if flags & FLAG_COMPRESSED:
                body = _inflate(body, self.max_payload_bytes)
            msg = codec.decode(body)
        except (_Oversized, codec.CodecLimit) as exc:
            raise self._reject("oversized", str(exc)) from None
        except (ValueError, zlib.error) as exc:  # CodecError is a ValueError
            raise self._reject("malformed", str(exc)) from None
        self._last_seq[src] = seq
        return Opened(src=src, dst=dst, round=rnd, seq=seq, msg=msg, payload_bytes=len(body),
                      data_bytes=codec.data_bytes(msg))
