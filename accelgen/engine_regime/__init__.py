"""Regime ``engine`` (SPEC section 12): SPEC 11's capacity method run inside the real vLLM CPU
engine, with the simulator, calibrated on that engine, predicting the same sweep.

``config`` (what runs), ``systems`` (each system in the engine and in the simulator, and the
tuned token budget), ``traces`` (the calibration trace and the sweep's traces with SLOs from the
engine's own cost model), ``run`` (replays, calibration, simulations), ``analyze`` (attainment
per point and class, capacity per system and repeat, the simulator's error and ordering),
``cli`` (``accelgen engine-sweep run|report``).
"""
