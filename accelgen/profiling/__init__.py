"""Measured iteration-latency profiles (``accelgen profile``).

Backends write the profile CSV that ``accelgen.costmodel.table.ProfileCostModel`` reads:

- ``torch``: a random-initialised decoder of a model's real shape (``torch_model``), timed per
  batch composition on CPU or CUDA;
- ``vllm``: engine step timings of a real vLLM engine (tiny model on CPU here);
- ``analytic``: the calibrated analytic model written out as a table (the pipeline's stand-in for
  GPU profiling on a machine without GPUs).

``accelgen calibrate`` fits the calibrated cost model to such a CSV (``accelgen.costmodel``).
"""
