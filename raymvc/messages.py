"""Typed protocol messages.

A :class:`Message` is a *kind* (a short string such as ``"labels"``) plus named
fields. A field is either a numpy array or a scalar (``int``, ``float``, ``bool``,
``str`` or ``None``). Nothing else can travel: the channel's codec turns a message
into a header and raw array buffers, so no party ever has to unpickle bytes that
came from another party.

Protocols build messages with plain keyword arguments::

    Message("labels", y=labels_array(y), obj=1.5)

and read them back with ``msg["y"]`` or ``msg.y``. A method that needs a new kind
of message just uses a new ``kind`` string: the engine never needs to know it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Scalar = int | float | bool | str | None
FieldValue = np.ndarray | Scalar

_SCALAR_TYPES = (int, float, bool, str, type(None))


@dataclass
class Message:
    """One protocol message: a kind and named array/scalar fields."""

    kind: str
    fields: dict[str, FieldValue] = field(default_factory=dict)

    def __init__(self, kind: str, fields: dict[str, FieldValue] | None = None, **kw: FieldValue):
        if not isinstance(kind, str) or not kind:
            raise TypeError("message kind must be a non-empty string")
        merged: dict[str, FieldValue] = dict(fields or {})
        merged.update(kw)
        for name, value in list(merged.items()):
            merged[name] = _check_field(kind, name, value)
        self.kind = kind
        self.fields = merged

    def __getitem__(self, name: str) -> FieldValue:
        return self.fields[name]

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.fields.items() if isinstance(v, np.ndarray)}

    def scalars(self) -> dict[str, Scalar]:
        return {k: v for k, v in self.fields.items() if not isinstance(v, np.ndarray)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self.kind != other.kind or self.fields.keys() != other.fields.keys():
            return False
        for k, v in self.fields.items():
            w = other.fields[k]
            if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
                if not (isinstance(v, np.ndarray) and isinstance(w, np.ndarray)):
                    return False
                if v.dtype != w.dtype or v.shape != w.shape or not np.array_equal(v, w):
                    return False
            elif v != w or type(v) is not type(w):
                return False
        return True

    def __repr__(self) -> str:
        parts = []
        for k, v in self.fields.items():
            if isinstance(v, np.ndarray):
                parts.append(f"{k}={v.dtype}{list(v.shape)}")
            else:
                parts.append(f"{k}={v!r}")
        return f"Message({self.kind!r}, {', '.join(parts)})"


def _check_field(kind: str, name: str, value: Any) -> FieldValue:
    if not isinstance(name, str) or not name:
        raise TypeError(f"message {kind!r}: field names must be non-empty strings")
    if isinstance(value, np.ndarray):
        if value.dtype == object or value.dtype.kind not in "biuf":  # what the codec carries; no complex
            raise TypeError(f"message {kind!r}: field {name!r}: unsupported dtype {value.dtype}")
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, _SCALAR_TYPES):
        return value
    raise TypeError(
        f"message {kind!r}: field {name!r} has type {type(value).__name__}; "
        "only numpy arrays and int/float/bool/str/None may travel"
    )


def labels_array(y: np.ndarray) -> np.ndarray:
    """Return ``y`` as the smallest unsigned integer type that holds its values.

    Protocols call this on cluster labels before sending them, so labels cost one
    byte per sample for up to 256 clusters.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-d array, got shape {y.shape}")
    if y.dtype.kind not in "iub":
        if y.dtype.kind != "f" or not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            raise ValueError(f"labels must be whole numbers, got {y.dtype} values such as {y.ravel()[:3].tolist()}")
    if y.size and y.min() < 0:
        raise ValueError(f"labels must be non-negative, got {y.min()}")
    top = int(y.max()) if y.size else 0
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if top <= np.iinfo(dt).max:
            return y.astype(dt, copy=False)
    raise ValueError("labels too large")  # pragma: no cover


@dataclass
class Done:
    """Returned by a server's ``step`` when the protocol has finished.

    ``labels`` are the final cluster labels for all ``n_samples`` (vertical methods,
    whose server holds the consensus; -1 for a sample the server has no label for, e.g.
    no client holding one of its views ever answered), or ``None`` when every client
    labels its own samples; then the engine collects them on the evaluation path.

    ``final``: with ``labels`` None, the message that gives a client what it needs to
    label its rows (the final model). Where a scenario asks for an inference round
    (``faults.inference_round``), the engine hands it to every client available after
    the last round, metered and subject to faults, before it collects the labels; the
    client takes it in its ``handle`` like any message, and its reply is not read.
    """

    labels: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)
    final: Message | None = None
