"""Workloads: real-format loaders, the embedded synthetic mix, arrivals, SLOs and trace files.

Typical use::

    from accelgen.workloads import WorkloadConfig, build_trace, write_trace, load_trace
    cfg = WorkloadConfig.from_yaml("config/quick.yaml")          # the `workload` section
    trace = build_trace(cfg, prefill_latency=cost_model.prefill_time, latency_name="...")
    write_trace(trace.df, trace.meta, "data/quick/trace.parquet")
    requests, output_len = to_requests(load_trace("data/quick/trace.parquet"))
"""

from accelgen.workloads.build import Trace, build_trace
from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.trace import load_trace, read_trace_metadata, to_requests, write_trace
from accelgen.workloads.workload_spec import ArrivalConfig, SLOConfig, SourceSpec, WorkloadConfig

__all__ = [
    "ArrivalConfig",
    "SLOConfig",
    "SourceSpec",
    "Trace",
    "WorkloadConfig",
    "WorkloadError",
    "build_trace",
    "load_trace",
    "read_trace_metadata",
    "to_requests",
    "write_trace",
]
