"""Regime ``engine`` (SPEC sections 12 and 13): SPEC 11's capacity method run inside the real vLLM
CPU engine, with the simulator, calibrated on that engine, predicting the same sweep.

``sweep_spec`` (what runs), ``systems`` (each system in the engine and in the simulator, and the
tuned token budget), ``traces`` (the calibration trace and the sweep's traces with SLOs from the
engine's own cost model), ``search`` (capacity by search: a coarse pass, then bisection near a
system's knee), ``engines`` (an engine process per system; the host's step jitter), ``run``
(calibration, plan with the jitter rule, the simulator's and the engine's searches),
``analyze`` (attainment per probe and class, capacity per system and repeat, the pairs the
engine separates, the simulator's error and ordering), ``accelgen.cli.engine_sweep``
(``accelgen engine-sweep run|report``).
"""
