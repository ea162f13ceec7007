"""``python -m accelgen.cli <command> ...``: the same as the ``accelgen`` console script."""

import sys

from accelgen.cli import main

sys.exit(main())
