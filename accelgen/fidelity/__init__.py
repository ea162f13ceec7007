"""Simulator fidelity against the real vLLM CPU engine (``accelgen fidelity``, the pipeline's
``fidelity`` stage): real replays in rounds, the cost model calibrated on one stock replay, the
other rounds predicted by the simulator out of sample (docs/profiling.md section 3).

``config`` (what runs), ``run`` (replays, calibration, simulations), ``compare`` (the
comparison and the per-step residuals), ``report`` and ``plot`` (table, CSV, figure), ``cli``.
"""
