"""Safe binary codec for :class:`~raymvc.messages.Message`.

Nothing here ever unpickles. An encoded message is::

    b"RMVC" | version (1 byte) | header length (uint32 LE) | UTF-8 JSON header | buffers

The JSON header is ``{"kind": str, "scalars": {name: value}, "arrays": [[name, dtype,
shape, nbytes], ...]}`` and the array buffers follow it in the listed order, each
C-contiguous and little-endian. Scalars keep their JSON type (``true`` stays a bool,
``1`` an int, ``1.0`` a float); non-finite floats are written as ``{"f": "nan"}``,
``{"f": "inf"}`` or ``{"f": "-inf"}`` because JSON has no literal for them.

:func:`decode` trusts nothing: every structural problem raises :class:`CodecError`.
Its work is bounded before anything is allocated for a header: the header may be at
most :data:`MAX_HEADER_BYTES` long and name at most :data:`MAX_FIELDS` fields
(:class:`CodecLimit` otherwise), so a small frame cannot make the receiver parse
hundreds of megabytes of JSON or build millions of empty arrays. :func:`encode` refuses
messages over the same limits.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from ..messages import Message

MAGIC = b"RMVC"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")  # magic, version, header length
PREFIX_BYTES = _PREFIX.size
MAX_HEADER_BYTES = 1 << 20  # a real header is a few hundred bytes per field
MAX_FIELDS = 65_536

ALLOWED_DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
FLOAT_DTYPES = ("float64", "float32")
_MAX_NDIM = 32
_MAX_DIM = 2**63 - 1
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class CodecError(ValueError):
    """Raised when a message cannot be encoded or bytes are not a valid encoding."""


class CodecLimit(CodecError):
    """An encoding over the codec's limits: a header longer than :data:`MAX_HEADER_BYTES`
    or more than :data:`MAX_FIELDS` fields."""


# --------------------------------------------------------------------------- encode


def _encode_scalar(name: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"f": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    raise CodecError(f"field {name!r}: unsupported scalar type {type(value).__name__}")


def _wire_array(name: str, arr: np.ndarray, float_dtype: str) -> np.ndarray:
    """Return ``arr`` as the C-contiguous little-endian array that goes on the wire."""
    dt = arr.dtype
    if dt.kind == "f" and float_dtype == "float32":
        dt = np.dtype(np.float32)
    name_str = np.dtype(dt.newbyteorder("=")).name
    if name_str not in ALLOWED_DTYPES:
        raise CodecError(f"field {name!r}: dtype {arr.dtype} cannot be encoded")
    return np.asarray(arr, dtype=np.dtype(name_str).newbyteorder("<"), order="C")


def encode(msg: Message, float_dtype: str = "float64") -> bytes:
    """Encode ``msg`` to bytes.

    With ``float_dtype="float32"`` every floating array is cast to float32; with
    ``"float64"`` arrays keep their dtype. Integer and bool arrays never change.
    """
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, got {float_dtype!r}")
    if not isinstance(msg, Message):
        raise CodecError(f"expected a Message, got {type(msg).__name__}")
    if len(msg.fields) > MAX_FIELDS:
        raise CodecLimit(f"{len(msg.fields)} fields, more than the limit of {MAX_FIELDS}")
    scalars: dict[str, Any] = {}
    arrays: list[list[Any]] = []
    buffers: list[bytes] = []
    for name, value in msg.fields.items():
        if isinstance(value, np.ndarray):
            wire = _wire_array(name, value, float_dtype)
            buf = wire.tobytes(order="C")
            dtype_name = np.dtype(wire.dtype.newbyteorder("=")).name
            arrays.append([name, dtype_name, [int(d) for d in wire.shape], len(buf)])
            buffers.append(buf)
        else:
            scalars[name] = _encode_scalar(name, value)
    header = {"kind": msg.kind, "scalars": scalars, "arrays": arrays}
    try:
        hbytes = json.dumps(header, allow_nan=False, ensure_ascii=False,
                            separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate in a name or a string
        raise CodecError(f"a name or string is not valid Unicode text: {exc.reason}") from None
    if len(hbytes) > MAX_HEADER_BYTES:
        raise CodecLimit(f"header of {len(hbytes)} bytes is longer than the limit of {MAX_HEADER_BYTES} bytes")
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(hbytes)), hbytes, *buffers])


def data_bytes(msg: Message, float_dtype: str = "float64") -> int:
    """Bytes of information in ``msg`` as it travels: array buffers after the float
    cast, 8 bytes per numeric scalar, UTF-8 length of strings; no header or framing.
    This is the quantity analytic communication counts (papers) speak about."""
    total = 0
    for value in msg.fields.values():
        if isinstance(value, np.ndarray):
            itemsize = value.dtype.itemsize
            if value.dtype.kind == "f" and float_dtype == "float32":
                itemsize = 4
            total += itemsize * int(value.size)
        elif isinstance(value, str):
            total += len(value.encode("utf-8"))
        elif value is not None:
            total += 8
    return total


# --------------------------------------------------------------------------- decode


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CodecError(f"duplicate key {k!r} in header")
        out[k] = v
    return out


def _reject_constant(token: str) -> Any:
    raise CodecError(f"header contains non-standard JSON constant {token}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _decode_scalar(name: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and list(value) == ["f"] and value["f"] in _NONFINITE:
        return _NONFINITE[value["f"]]
    raise CodecError(f"scalar {name!r} has an invalid value")


def _check_name(name: Any, seen: set[str]) -> str:
    if not isinstance(name, str) or not name:
        raise CodecError("field names must be non-empty strings")
    if name in seen:
        raise CodecError(f"duplicate field name {name!r}")
    seen.add(name)
    return name


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates,
                            parse_constant=_reject_constant)
    except CodecError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CodecError(f"header is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"kind", "scalars", "arrays"}:
        raise CodecError("header must be an object with keys kind, scalars, arrays")
    if not isinstance(header["kind"], str) or not header["kind"]:
        raise CodecError("header kind must be a non-empty string")
    if not isinstance(header["scalars"], dict):
        raise CodecError("header scalars must be an object")
    if not isinstance(header["arrays"], list):
        raise CodecError("header arrays must be a list")
    return header


def _parse_array_entry(entry: Any) -> tuple[Any, str, tuple[int, ...], int]:
    if not isinstance(entry, list) or len(entry) != 4:
        raise CodecError("each array entry must be [name, dtype, shape, nbytes]")
    name, dtype_name, shape, nbytes = entry
    if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:
        raise CodecError(f"array {name!r}: dtype {dtype_name!r} is not allowed")
    if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
        raise CodecError(f"array {name!r}: shape must be a list of at most {_MAX_NDIM} ints")
    if not all(_is_int(d) and 0 <= d <= _MAX_DIM for d in shape):
        raise CodecError(f"array {name!r}: shape entries must be non-negative ints")
    if not _is_int(nbytes) or nbytes < 0:
        raise CodecError(f"array {name!r}: nbytes must be a non-negative int")
    expected = math.prod(shape) * np.dtype(dtype_name).itemsize
    if nbytes != expected:
        raise CodecError(f"array {name!r}: nbytes {nbytes} != {expected} for shape {shape}")
    return name, dtype_name, tuple(shape), nbytes


def check_prefix(prefix: bytes, size: int) -> int:
    """Check the fixed prefix of an encoding of ``size`` bytes; return its header length.

    Raises :class:`CodecError` for a bad magic, version or a header running past the end,
    and :class:`CodecLimit` for a header over :data:`MAX_HEADER_BYTES`, before any of
    the header is read.
    """
    if len(prefix) < _PREFIX.size or size < _PREFIX.size:
        raise CodecError("truncated data: shorter than the fixed prefix")
    magic, version, hlen = _PREFIX.unpack_from(prefix, 0)
    if magic != MAGIC:
        raise CodecError("bad magic: not an encoded message")
    if version != VERSION:
        raise CodecError(f"unsupported codec version {version}")
    check_header_length(prefix)
    if hlen > size - _PREFIX.size:
        raise CodecError("truncated data: header runs past the end")
    return hlen


def check_header_length(prefix: bytes) -> None:
    """Raise :class:`CodecLimit` if the prefix announces a header over :data:`MAX_HEADER_BYTES`."""
    if len(prefix) >= _PREFIX.size:
        hlen = _PREFIX.unpack_from(prefix, 0)[2]
        if hlen > MAX_HEADER_BYTES:
            raise CodecLimit(f"header of {hlen} bytes is longer than the limit of {MAX_HEADER_BYTES} bytes")


def decode(data: bytes) -> Message:
    """Decode bytes made by :func:`encode`; raise :class:`CodecError` on any defect.

    Returned arrays are fresh, writable, native-order copies.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    hlen = check_prefix(data[:_PREFIX.size], len(data))
    pos = _PREFIX.size
    header = _parse_header(data[pos:pos + hlen])
    pos += hlen
    n_fields = len(header["scalars"]) + len(header["arrays"])
    if n_fields > MAX_FIELDS:
        raise CodecLimit(f"{n_fields} fields, more than the limit of {MAX_FIELDS}")

    seen: set[str] = set()
    fields: dict[str, Any] = {}
    for name, value in header["scalars"].items():
        fields[_check_name(name, seen)] = _decode_scalar(name, value)
    for entry in header["arrays"]:
        name, dtype_name, shape, nbytes = _parse_array_entry(entry)
        _check_name(name, seen)
        if nbytes > len(data) - pos:
            raise CodecError(f"truncated data: buffer of array {name!r} runs past the end")
        wire_dt = np.dtype(dtype_name).newbyteorder("<")
        try:
            arr = np.frombuffer(data, dtype=wire_dt, count=nbytes // wire_dt.itemsize,
                                offset=pos).reshape(shape)
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:
            raise CodecError(f"array {name!r}: cannot rebuild: {exc}") from None
        if dtype_name == "bool" and data[pos:pos + nbytes].translate(None, b"\x00\x01"):
            raise CodecError(f"array {name!r}: bool buffer holds bytes other than 0 and 1")
        fields[name] = arr.astype(np.dtype(dtype_name), copy=True)
        pos += nbytes
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes after the last buffer")
    try:
        return Message(header["kind"], fields)
    except (TypeError, ValueError) as exc:  # pragma: no cover - checked above
        raise CodecError(str(exc)) from None
