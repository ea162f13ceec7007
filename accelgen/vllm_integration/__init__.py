"""AccelGen inside a real vLLM V1 engine.

- ``scheduler``: ``AccelGenScheduler``, a ``vllm.v1.core.sched.scheduler.Scheduler`` subclass
  that runs any ``accelgen.policies`` policy (the same object the simulator runs) and applies its
  decisions around vLLM's own ``schedule()``; ``InstrumentedScheduler``, stock vLLM scheduling
  with the same per-step and per-token recording, for baseline runs.
- ``config``: how the plugin is configured (policy, SLO defaults, cost model, pivot), also when
  the engine core runs in a child process.
- ``replay``: feeds a trace into an engine at its arrival times and writes the simulator's
  results files. ``tiny_model``: a random-weight model directory for CPU runs.

Importing this package does not import vLLM; ``scheduler`` and ``replay`` do, and refuse any vLLM
other than ``SUPPORTED_VLLM_VERSION`` (the scheduler interface they rely on is not public).
"""

from accelgen.vllm_integration.version import (
    SUPPORTED_VLLM_VERSION,
    UnsupportedVLLMVersion,
    check_vllm_version,
)

# The dotted path for `scheduler_cls=` / `--scheduler-cls`; a string keeps vLLM's config
# picklable and lets an engine-core child process import the class itself.
SCHEDULER_CLS = "accelgen.vllm_integration.scheduler.AccelGenScheduler"
STOCK_SCHEDULER_CLS = "accelgen.vllm_integration.scheduler.InstrumentedScheduler"

__all__ = ["SCHEDULER_CLS", "STOCK_SCHEDULER_CLS", "SUPPORTED_VLLM_VERSION",
           "UnsupportedVLLMVersion", "check_vllm_version"]
