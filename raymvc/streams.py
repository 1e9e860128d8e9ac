"""Every random stream of a run, in one table.

A run draws nothing from a shared generator: each decision draws from a stream of its
own, ``default_rng([seed, TAG, *keys])`` (:func:`stream`), keyed by the scenario's seed, the
stream's tag below and what the decision is about (round, client, exchange, quantity).
So whether client 3 drops out of round 7 does not depend on what was drawn before it, on
the backend, or on how many actors host the clients. Two consumers never share a tag
(``tests/test_layout.py`` checks it); a new kind of draw takes a new tag here.
"""

from __future__ import annotations

import zlib

import numpy as np

# -- data -------------------------------------------------------------------
SPLIT = 1  # raymvc.data.prepare: rows and views among the clients, missing views, unaligned rows
# (the data sets' own draws -- synthetic data, the noisy copy of Noisy MNIST -- use
# default_rng(seed) of the data section's seed, not a run stream)

# -- the protocols (ctx.rng_for) ----------------------------------------------------
CLIENT = 2  # keys: client, round, then the method's tag (a string enters as its CRC-32)
SERVER = 3  # keys: round, then the method's tag

# -- the fault plan (raymvc.runtime.faults) -------------------------------------------
DISCONNECT = 101  # who never connects
STRAGGLERS = 102  # who straggles
DROPOUT = 103  # keys: round, client (a second draw picks the exchange under secure aggregation)
DELAY = 104  # a straggler's delay; keys: round, client, exchange
PARTIAL = 108  # faults.partial_work; keys: client, round
SAMPLING = 109  # faults.sampling's rule (raymvc.selection); keys: round
DEVICE = 110  # a device profile's quantities; keys: client, quantity
DEVICE_CLASS = 111  # which clients get which device class
KIND = 112  # faults.kinds (raymvc.kinds); keys: the kind's name, round, client, then the kind's own

# -- availability models (raymvc.availability) ------------------------------------
PER_CLIENT = 105  # per_client: each client's own rate; keys: client
PHASE = 106  # diurnal: each client's phase; keys: client
MARKOV = 107  # markov: the chain's steps; keys: client, step

# -- secure aggregation (raymvc.runtime.secagg) --------------------------------------
SECAGG_GROUPS = 0x5EC  # SecAgg+ neighbourhoods (public, nothing secret is drawn from it)

TAGS = {name: value for name, value in globals().items() if name.isupper() and isinstance(value, int)}


def stream(seed: int, *keys: int | str) -> np.random.Generator:
    """The generator of the stream ``keys`` (a tag of this table first, then what the draw is
    about); a string key enters as its CRC-32. Two calls with the same arguments give the
    same draws, whatever was drawn elsewhere."""
    return np.random.default_rng([int(seed), *(zlib.crc32(k.encode()) if isinstance(k, str) else int(k)
                                               for k in keys)])
