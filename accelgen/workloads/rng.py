"""Independent, named random streams derived from one seed.

Every component draws from its own stream keyed by (seed, names): changing the SLO settings or the
arrival rate never changes the lengths, and adding a source to a mix leaves the other sources'
draws alone. The key is a CRC32 of each name, so it is stable across runs and platforms (Python's
``hash`` is salted per process).
"""

from __future__ import annotations

import zlib

import numpy as np


def stream(seed: int, *names: str) -> np.random.Generator:
    key = tuple(zlib.crc32(name.encode("utf-8")) for name in names)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
