"""``python -m accelgen.policies.accelgen``: build AccelGen's decision ahead of time (``build``)."""

import sys

from accelgen.policies.accelgen.build import build

if sys.argv[1:]:
    raise SystemExit("usage: python -m accelgen.policies.accelgen")
built = build()
print(f"accelgen: built {built} ({built.stat().st_size // 1024} KiB)")
