#!/usr/bin/env python
"""Time to AccelGen's first decision in a fresh process: from the process's start through the
imports, a policy and a view of 20 waiting requests (OPT-13B's analytic cost model), to the
first ``schedule()`` returning; then a second decision for scale.

Run it a few times (the first run after a source change also pays numba's compilation, unless
the ahead-of-time build is current: ``bash scripts/setup.sh``):

    for i in 1 2 3; do .venv/bin/python scripts/bench_first_decision.py; done
    ACCELGEN_DECISION=jit .venv/bin/python scripts/bench_first_decision.py   # the JIT cache

Prints one line: which build ran, the imports, the first decision, the second, the total from
the process's start, and whether numba was loaded. Not a unit test: timing on a shared machine.
"""

import time

T0 = time.perf_counter()
import sys  # noqa: E402

from accelgen.core.kvcache import BlockManager  # noqa: E402
from accelgen.core.policy import SchedulerView  # noqa: E402
from accelgen.core.request import Request  # noqa: E402
from accelgen.core.specs import Deployment  # noqa: E402
from accelgen.costmodel.factory import deployment_pivot, make_cost_model  # noqa: E402
from accelgen.policies.registry import make_policy  # noqa: E402


def main() -> None:
    t1 = time.perf_counter()
    dep = Deployment()
    cost, pivot, kv = make_cost_model(dep), deployment_pivot(dep), BlockManager(491, 32)
    reqs = [Request(req_id=i, arrival=0.01 * i, prompt_len=100 + 37 * i, ttft_slo=1.0,
                    tbt_slo=0.2) for i in range(20)]
    pol = make_policy("accelgen")
    for r in reqs:
        pol.on_arrival(r, r.arrival)
    view = SchedulerView(now=0.3, waiting=reqs, running=[], swapped=[], kv=kv, cost=cost,
                         pivot=pivot, max_model_len=2048)
    t2 = time.perf_counter()
    pol.schedule(view)
    t3 = time.perf_counter()
    pol.schedule(view)
    t4 = time.perf_counter()
    try:
        from accelgen.policies.accelgen.build import load

        build = load()[0]
    except ImportError:  # a checkout from before the decision's builds
        build = "unnamed"
    print(f"build {build}: imports {t1 - T0:.3f} s, first decision {t3 - t2:.3f} s, second "
          f"{1e6 * (t4 - t3):.0f} us, process start to first decision {t3 - T0:.3f} s, numba "
          f"{'loaded' if 'numba' in sys.modules else 'not loaded'}")


if __name__ == "__main__":
    main()
