"""A run of decode steps decided in one compiled call (``AccelGenPolicy.decide_decode_run``): the
decision asked before each step of a run whose clock and free blocks the backend already knows,
exactly as ``schedule_after_decodes`` asks it step by step, for as long as it keeps its batch.
What a Python call per step costs (several microseconds) is most of a simulation of a lightly
loaded server, where a request decodes alone for thousands of steps (``docs/simulator.md``,
*Performance*)."""

from __future__ import annotations

import numpy as np

from accelgen.policies.accelgen import rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.decide import decide
from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.loop_step import take_in


@jit
def decode_run(a: st.DecisionArrays, clock: np.ndarray, latencies: np.ndarray,
               free_blocks: np.ndarray, blocks: np.ndarray, first_need: np.ndarray,
               run: np.ndarray, info: np.ndarray, infos: np.ndarray, loop: np.ndarray,
               errors: np.ndarray, scratch: np.ndarray) -> int:
    """Decide steps ``run[0].first`` to ``run[0].last`` (exclusive) of a decode run of the
    previous decision's batch (the head of ``Batch.slots``, ``run[0].batch`` requests). Before
    step ``k`` each request of the batch takes in its token of the step before at ``clock[k]``
    (``rank.decode_row``), holding its ``blocks`` of the run's start and one more from each
    ``block_size``-th step on from its ``first_need``; the decision then runs with
    ``free_blocks[k]`` and the step before's budget and ERA holder. Each step whose decision is
    the same batch and nothing else (no chunk cut, nothing asked of the cost model) leaves its
    diagnostics (``info``, the record's float view) in ``infos[k]``. With ``run[0].exact_only``
    (the closed loop at rest) a step is decided only if the step before took (``latencies``)
    what its decision predicted, a ratio of 1 to EXACT_RATIO (the loop's take-in of it changes
    nothing then). With ``run[0].observes`` the closed loop (``loop[0]``, its error window
    ``errors``, ``scratch`` as long) takes in the step before each step, as
    ``schedule_after_decodes`` does before deciding, and the plan's scales follow it
    (``loop_step.take_in``). Returns the step after the last such step; ``run[0].stop`` says where it
    stopped: RUN_ALL (after every step), RUN_DECIDED (the returned step's decision is complete
    and differs), RUN_ASKS (it waits on the latency of ``run[0].need`` budget tokens' full
    batch: ``Workspace.complete``) or RUN_OBSERVES (the returned step is not decided: the
    prediction before it was not exact); ``run[0].budget`` and ``era_owner``: the last same
    step's."""
    rec, ctl = a.state[0], run[0]
    step, par, out, ora = rec.step, rec.params, rec.outcome, rec.oracle
    slots = a.lists[0]  # (``Batch.slots``)
    n, block_size = ctl.batch, ctl.block_size
    for k in range(ctl.first, ctl.last):
        if k and ctl.exact_only:
            predicted, took = infos[k - 1, ctl.planned_at], latencies[k - 1]
            if not (0.0 < predicted < np.inf and 0.0 < took < np.inf
                    and abs(took / predicted - 1.0) <= st.EXACT_RATIO):
                ctl.stop = st.RUN_OBSERVES
                return k
        elif k and ctl.observes and take_in(loop[0], errors, scratch,
                                            infos[k - 1, ctl.planned_at],
                                            latencies[k - 1]) == st.LOOP_CHANGED:
            # (the plan's scales: ``ClosedLoop.scales``, as ``Workspace.set_scales`` sets them)
            lp = loop[0]
            par.time_scale, par.tbt_shrink = lp.correction, 1.0 / (1.0 + lp.margin)
            par.err_median, par.err_sd, par.err_z = lp.median, lp.sd, lp.z
            par.risk = 1.0 - lp.target if lp.sd > 0.0 else 0.0
        now = clock[k]
        for i in range(n):
            j = first_need[i]
            grown = (k - 1 - j) // block_size + 1 if k > j else 0
            rank.decode_row(a.requests[slots[i]], blocks[i] + grown, now)
        step.now, step.free_blocks = now, free_blocks[k]
        if par.exact_kv:  # (``Workspace.run``: the counters accumulate over one decision's passes)
            ora.excluded = ora.reforms = ora.n_over = 0
        need = decide(a)
        if need != st.NO_ASK:
            ctl.stop, ctl.need = st.RUN_ASKS, need
            return k
        if not out.same_batch or out.n_cut:
            ctl.stop = st.RUN_DECIDED
            return k
        for c in range(len(info)):  # (a slice assignment would need numba's runtime)
            infos[k, c] = info[c]
        step.prev_budget = ctl.budget = out.budget
        step.era_owner = ctl.era_owner = out.era_owner
        step.dirty_lo = step.dirty_hi = step.n_gone = 0  # (taken in: ``RequestTable.seen``)
        step.reindex = False
    ctl.stop = st.RUN_ALL
    return ctl.last
