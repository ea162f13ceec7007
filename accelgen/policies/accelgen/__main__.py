"""``python -m accelgen.policies.accelgen``: build AccelGen's decision ahead of time (``build``),
unless a build of the current sources (and numba and numpy) is there already; ``--force``: build
it again."""

import sys

from accelgen.policies.accelgen.build import aot_path, build

if sys.argv[1:] not in ([], ["--force"]):
    raise SystemExit("usage: python -m accelgen.policies.accelgen [--force]")
current = aot_path()  # (a digest of the sources: read once)
if not sys.argv[1:] and current.exists():
    print(f"accelgen: the build of these sources is there: {current}")
else:
    built = build()
    print(f"accelgen: built {built} ({built.stat().st_size // 1024} KiB)")
