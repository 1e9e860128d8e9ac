"""Checkpoints of a party's state, through the channel's codec -- never pickle.

:func:`dump_state` walks an object's attributes (numpy arrays and scalars, Python
scalars, lists, tuples, sets, dicts, dataclasses and plain objects of raymvc or the
protocol's own module, torch tensors, modules, optimisers and generators, numpy
generators, :class:`~raymvc.messages.Message` and :class:`~raymvc.messages.Done`) and
encodes the tree as one message: a JSON description in a string field plus one array
field per array. :func:`load_state` puts such a tree back into a freshly built object
of the same kind, and builds nothing by a name read from the checkpoint: an object is
restored only into the object the fresh party already holds at that place, of exactly
the recorded class (filled attribute by attribute; torch modules and optimisers are
loaded in place), or, where it holds none (a row of a list), as an instance of a
dataclass of plain data registered in code (:func:`register_plain_data`: the ledger's
rows, the engine's counters). Anything else is a :class:`StateError`, so a method that
keeps, say, a fitted scikit-learn estimator between rounds simply cannot be
checkpointed (and says so) rather than being pickled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

import numpy as np

from ..channel import codec
from ..channel.meter import LedgerRow
from ..messages import Done, Message
from ..safeio import SafeReadError, json_loads
from .records import FaultCounts, Participation

_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


class StateError(ValueError):
    """A state that cannot be checkpointed or restored."""


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# dataclasses of plain data a checkpoint may hold where the fresh party holds no object
_PLAIN_DATA: dict[str, type] = {}


def register_plain_data(cls: type) -> type:
    """Let checkpoints hold instances of the dataclass ``cls`` anywhere (e.g. in a list).

    The instance is rebuilt by calling ``cls`` with its restored fields, which must be
    plain data themselves. Usable as a class decorator.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"only dataclasses can be registered as plain data, not {cls!r}")
    _PLAIN_DATA[_class_name(cls)] = cls
    return cls


for _cls in (LedgerRow, FaultCounts, Participation):
    register_plain_data(_cls)


def _is_torch(v: Any, name: str) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    kinds = {"tensor": torch.Tensor, "module": torch.nn.Module, "optim": torch.optim.Optimizer,
             "gen": torch.Generator, "device": torch.device}
    return isinstance(v, kinds[name])


class _Encoder:
    def __init__(self, allowed: tuple[str, ...]):
        self.arrays: dict[str, np.ndarray] = {}
        self.allowed = allowed

    def array(self, a: np.ndarray) -> dict:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.array(a, order="C", copy=True)  # keeps 0-d arrays 0-d
        return {"nd": key}

    def __call__(self, v: Any, path: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, np.generic):  # before float: np.float64 is a float too, and must come back as itself
            return {"np": self.array(np.asarray(v))}
        if isinstance(v, int) and not isinstance(v, bool):
            return {"int": str(v)}  # exact, whatever its size
        if isinstance(v, float):
            return {"float": v if math.isfinite(v) else repr(v)}
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise StateError(f"{path}: object arrays cannot be checkpointed")
            return self.array(v)
        return self._container(v, path)

    def _container(self, v: Any, path: str) -> Any:
        if isinstance(v, (list, tuple, set, frozenset)):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            kind = {list: "list", tuple: "tuple"}.get(type(v), "set")
            return {kind: [self(x, f"{path}[{i}]") for i, x in enumerate(items)]}
        if isinstance(v, dict):
            return {"dict": [[self(k, f"{path}.key"), self(x, f"{path}[{k!r}]")] for k, x in v.items()]}
        if isinstance(v, Message):
            return {"msg": v.kind, "fields": self(dict(v.fields), f"{path}.fields")}
        if isinstance(v, Done):
            return {"done": self({"labels": v.labels, "info": v.info, "final": v.final}, path)}
        if isinstance(v, np.random.Generator):
            return {"npgen": self(v.bit_generator.state, path)}
        return self._torch_or_object(v, path)

    def _torch_or_object(self, v: Any, path: str) -> Any:
        if _is_torch(v, "tensor"):
            return {"tensor": self.array(v.detach().cpu().numpy())}
        if _is_torch(v, "module"):
            return {"module": self(dict(v.state_dict()), path)}
        if _is_torch(v, "optim"):
            return {"optim": self(v.state_dict(), path)}
        if _is_torch(v, "gen"):
            return {"tgen": self.array(v.get_state().numpy())}
        if _is_torch(v, "device"):
            return {"tdev": str(v)}
        cls = type(v)
        if not cls.__module__.startswith(self.allowed) or not hasattr(v, "__dict__"):
            raise StateError(f"{path}: a {cls.__module__}.{cls.__qualname__} cannot be checkpointed")
        attrs = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)} if dataclasses.is_dataclass(v) \
            else dict(vars(v))
        return {"obj": f"{cls.__module__}:{cls.__qualname__}", "attrs": self(attrs, path)}


class _Decoder:
    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def __call__(self, node: Any, current: Any = None) -> Any:
        if node is None or isinstance(node, (bool, str)):
            return node
        if not isinstance(node, dict) or len(node) not in (1, 2):
            raise StateError(f"malformed state node {str(node)[:80]!r}")
        tag = next(iter(node))
        if tag == "int":
            return int(node["int"])
        if tag == "float":
            v = node["float"]
            return float(v) if isinstance(v, str) else v
        if tag == "nd":
            return self.arrays[node["nd"]].copy()
        if tag == "np":
            return self(node["np"])[()]
        if tag in ("list", "tuple", "set"):
            items = [self(x) for x in node[tag]]
            return {"list": list, "tuple": tuple, "set": set}[tag](items)
        if tag == "dict":
            return {self(k): self(x, current.get(self(k)) if isinstance(current, dict) else None)
                    for k, x in node["dict"]}
        return self._special(tag, node, current)

    def _special(self, tag: str, node: dict, current: Any) -> Any:
        if tag == "msg":
            return Message(node["msg"], self(node["fields"]))
        if tag == "done":
            d = self(node["done"])
            return Done(labels=d["labels"], info=d["info"], final=d.get("final"))
        if tag == "npgen":
            state = self(node["npgen"])
            if state.get("bit_generator") not in _BIT_GENERATORS:
                raise StateError(f"unknown bit generator {str(state.get('bit_generator'))[:40]!r}")
            g = np.random.Generator(getattr(np.random, state["bit_generator"])())
            g.bit_generator.state = state
            return g
        if tag in ("tensor", "module", "optim", "tgen", "tdev"):
            return self._torch(tag, node, current)
        if tag == "obj":
            return self._object(node, current)
        raise StateError(f"unknown state node {tag!r}")

    def _torch(self, tag: str, node: dict, current: Any) -> Any:
        import torch

        if tag == "tdev":  # the restored object already chose its device (params.device)
            return current if isinstance(current, torch.device) else torch.device(node["tdev"])
        if tag == "tensor":
            dev = current.device if isinstance(current, torch.Tensor) else "cpu"
            return torch.from_numpy(self.arrays[node["tensor"]["nd"]].copy()).to(dev)
        if tag == "tgen":
            g = current if isinstance(current, torch.Generator) else torch.Generator()
            g.set_state(torch.from_numpy(self.arrays[node["tgen"]["nd"]].copy()))
            return g
        if current is None:
            raise StateError(f"a torch {tag} can only be restored into the object that owns it: build it in __init__")
        current.load_state_dict(self(node[tag]))
        return current

    def _object(self, node: dict, current: Any) -> Any:
        name, attrs = node["obj"], node["attrs"]
        if not isinstance(name, str):
            raise StateError("malformed state node: an object without a class name")
        if current is not None and _class_name(type(current)) == name:
            restore_attrs(current, attrs, self)  # into the object the fresh party built
            return current
        cls = _PLAIN_DATA.get(name)
        if cls is None:
            raise StateError(f"refusing to build a {name[:80]} from a checkpoint: objects are only restored into "
                             "those the party built afresh, or as registered plain data")
        values = {_attr_name(self(k)): self(v) for k, v in attrs["dict"]}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if set(values) != set(fields):
            raise StateError(f"a {name[:80]} in the checkpoint does not have its fields")
        obj = cls(**{k: v for k, v in values.items() if fields[k].init})
        for k, v in values.items():
            if not fields[k].init:
                object.__setattr__(obj, k, v)
        return obj


def _attr_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("__"):
        raise StateError(f"malformed state: {str(name)[:40]!r} is not an attribute name")
    return name


def restore_attrs(obj: Any, attrs_node: dict, dec: _Decoder) -> None:
    for key_node, value_node in attrs_node["dict"]:
        name = _attr_name(dec(key_node))
        object.__setattr__(obj, name, dec(value_node, getattr(obj, name, None)))


MAX_TREE_BYTES = 1 << 30  # the description of one party's state (arrays travel beside it)
MAX_STATE_DEPTH = 96  # its nesting (a torch optimiser in a protocol object: ~12); the decoder recurses ~3 frames a level


def dump_state(obj: Any, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> bytes:
    """Encode ``obj``'s attributes (``only`` these, or all but ``skip``) as one codec frame.

    The description of the tree travels as a byte array, not in the codec's header, so a
    state that grows with the run (a server's ledger) stays within the codec's limits."""
    cls = type(obj)
    enc = _Encoder(("raymvc.", cls.__module__))
    attrs = {k: v for k, v in vars(obj).items() if k not in skip and (only is None or k in only)}
    tree = json.dumps(enc(attrs, cls.__qualname__), allow_nan=False).encode()
    return codec.encode(Message("state", {"tree": np.frombuffer(tree, dtype=np.uint8), **enc.arrays}))


def state_names(data: bytes) -> list[str]:
    """The attribute names a state frame would restore (for checking before anything runs)."""
    return [_attr_name(k) for k, _ in _tree(codec.decode(data))["dict"]]


def _tree(msg: Message) -> dict:
    tree = msg.get("tree") if msg.kind == "state" else None
    if not isinstance(tree, np.ndarray) or tree.dtype != np.uint8 or tree.ndim != 1 or tree.size > MAX_TREE_BYTES:
        raise StateError("not a state checkpoint")
    try:
        out = json_loads(tree.tobytes(), max_depth=MAX_STATE_DEPTH, what="its description")
    except SafeReadError as e:
        raise StateError(f"malformed state checkpoint ({e})") from None
    if not isinstance(out, dict) or not isinstance(out.get("dict"), list):
        raise StateError("malformed state checkpoint")
    return out


def load_state(obj: Any, data: bytes, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> None:
    """Restore attributes written by :func:`dump_state` into ``obj``, built afresh the same way.

    Only declared state comes back: with the ``skip``/``only`` the state was dumped with,
    a name outside them (a protocol's inputs, or anything but the engine's declared
    state) is a StateError and nothing is set."""
    msg = codec.decode(data)
    tree = _tree(msg)
    arrays = {k: v for k, v in msg.fields.items() if isinstance(v, np.ndarray) and k != "tree"}
    try:
        for k, _ in tree["dict"]:
            name = _attr_name(k)
            if name in skip or (only is not None and name not in only):
                raise StateError(f"the checkpoint sets {name[:40]!r}, which is not state of a "
                                 f"{type(obj).__qualname__}")
        restore_attrs(obj, tree, _Decoder(arrays))
    except StateError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise StateError(f"malformed state checkpoint ({type(e).__name__}: {str(e)[:80]})") from None
