"""The arrays AccelGen's compiled decision (``accelgen_decision``) works in, and how a policy
runs one decision through them.

Every quantity has a name: the arrays are numpy record arrays (``DecisionArrays``), whose fields
numba compiles as attributes (``d.cand[s].slack``; with the JIT off the same code runs on
``np.recarray`` rows); the policy's side uses NamedTuples of the same fields (``Step``,
``Outcome``; the batch the decision asks the cost model about is a ``BatchShape``, ``ASK``,
with one prompt chunk). The workspace is kept between decisions so that a decision allocates
nothing: in vLLM each step runs right after a forward pass has evicted the caches
(``docs/vllm.md``, *Scheduler time*). Nothing here imports numba.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, get_type_hints

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.analytic import RooflineTerms
from accelgen.costmodel.base import CostModel

if TYPE_CHECKING:
    from accelgen.core.policy import SchedulerView
    from accelgen.costmodel.linear import LinearTerms
    from accelgen.policies.accelgen import AccelGenParams
    from accelgen.policies.accelgen_table import RequestTable

i8, f8, b1 = np.int64, np.float64, np.bool_

CANDIDATE = np.dtype([
    ("rem", i8),  # tokens to compute before its next output (prompt + outputs - computed)
    ("total", i8),  # prompt + outputs: what a recompute re-prefills
    ("to_deadline", f8),  # deadline of its next output - now
    ("n_chunks", f8),  # N_ck: iterations its next output still needs (1 for a decode)
    ("slo_iter", f8),  # per-iteration SLO: TBT of an online decode, else to_deadline / N_ck
    ("slack", f8),
    ("key", f8),  # queue order: slack (lost prompts last, FCFS), or arrival under /Order
    ("victim_key", f8),  # a running request's slack once preempted (largest preempted first)
    ("next_blocks", i8), ("owed", i8), ("admission_blocks", i8),  # KV needs (-1: not yet known)
    ("is_decode", b1),
    ("online_decode", b1),
    ("is_long", b1),  # ERA: a long prompt
    ("lost", b1),  # its request-level SLO is lost (decision 11)
    ("eligible", b1),  # may join this decision (ERA, the Oracle's exact KV plan)
    ("available", b1),  # eligible, and not yet scheduled, preempted or shut out by ERA
    ("member", b1),  # in the batch
    ("urgent", b1),
    ("counted", b1),  # its per-iteration SLO counts toward SLO_min
    ("stamp", i8),  # the pass (``ledger.pass_id``) these columns are of
    ("over", b1),  # (Oracle) in this decision's ``lists.over`` (cleared after the decision)
], align=True)

LISTS = np.dtype([
    ("slots", i8), ("tokens", i8),  # the batch: (slot, tokens) in order
    ("preempted", i8),
    ("cut_chunks", i8),  # prompt chunks cut short by budget or KV (for L_c)
    ("victims", i8),  # running requests, largest victim key first
    ("urgent", i8),  # urgent candidates by slack
    ("order", i8),  # candidates left after step 1, by key
    ("group", i8),  # the current slack group
    ("short", i8),  # urgent decodes whose block needs a preemption
    ("fresh", i8), ("fresh_rem", i8), ("fresh_key", f8),  # Euclidean pools: prompts holding no KV,
    ("partial", i8),  # running prompts,
    ("dec_block", i8), ("dec_free", i8),  # decodes needing a new block / none
    ("fallback", i8),  # the deadlock breaker's candidates
    ("over", i8),  # the Oracle's over-admitted requests (excluded on the next pass)
    ("over_at", i8),  # their positions in the dormant queue (-1: active)
    ("touched", i8),  # dormant requests whose columns this pass computed
    ("last_slots", i8), ("last_tokens", i8),  # the previous decision's batch (``same_batch``)
], align=True)


class Step(NamedTuple):
    """The inputs of one decision (``STEP``, written by ``Workspace.run``)."""

    n: int  # live requests (rows of the table)
    now: float
    chunk_mean: float  # L_c
    era_owner: int  # slot of the long prompt holding ERA, -1 if none
    prev_budget: int  # the previous decision's token budget
    free_blocks: int
    admissions_left: int  # new requests it may admit (max_num_seqs)
    plan_only: bool  # stop after the plan (explain)
    n_active: int  # slots in ``active``
    n_dormant: int  # entries of the table's dormant queue, ``dormant[dormant_lo:][:n_dormant]``
    dormant_lo: int
    dirty_lo: int  # positions [dirty_lo, dirty_hi) of ``dormant`` changed since the last step
    dirty_hi: int
    n_gone: int  # counted entries that left the queue (their final KV in ``dormant_gone``)
    reindex: bool  # derive every dormant entry again (new parameters, or the table grew)


class Outcome(NamedTuple):
    """What the policy reads back (``OUTCOME``, all int64). The Oracle's counters accumulate
    over its passes (the policy zeroes them before a decision)."""

    n_sched: int
    n_preempted: int
    n_cut: int
    budget: int  # the token budget (after step 2 lowered it for a tighter group)
    era_owner: int  # slot of the long prompt holding ERA after this decision, -1 if none
    oracle_admissible: int  # free blocks not promised to the running requests' final KV
    oracle_excluded: int  # requests its exact KV plan kept out
    oracle_reforms: int  # passes that found over-admissions
    oracle_n_over: int  # over-admitted requests so far (``lists.over``)
    # 1: the batch (slots and tokens, in order) is the previous decision's, and nothing else is
    # scheduled (``AccelGenPolicy`` then hands back the previous ``Decision``); else 0
    same_batch: int


def _record(fields: type) -> np.dtype:
    kinds = {int: i8, float: f8, bool: b1}
    return np.dtype([(name, kinds[t]) for name, t in get_type_hints(fields).items()], align=True)


STEP, OUTCOME, ASK = _record(Step), _record(Outcome), _record(BatchShape)

LEDGER = np.dtype([
    # the running batch (for T_max)
    ("n_decodes", i8), ("decode_ctx", i8), ("prefill_ctx", i8),
    # the plan
    ("t_max", f8), ("slo_min", f8), ("clamped_low", b1), ("clamped_high", b1),
    # the batch under construction (its slots, preemptions and cuts counted in OUTCOME)
    ("budget_left", i8),  # A_c: tokens left in the budget
    ("kv_free", i8),  # free blocks (A_m / block size)
    ("reserved", i8),  # free blocks promised to running requests
    ("admissions", i8),  # admissions left in this step
    ("n_urgent", i8), ("n_order", i8),
    ("order_head", i8),  # order[:order_head] is no longer available
    ("n_victims", i8),  # -1 until the victims are first needed
    ("victim_head", i8),  # victims[:victim_head] were considered
    ("n_groups", i8), ("fallback", b1),
    ("pass_id", i8),  # counts the passes over the candidates (``cand.stamp``)
    ("era_owner_start", i8),  # the ERA owner when the pass began (eligibility)
    ("oversize", i8),  # /Chunk: the oversized head prompt, -1 if none
    ("n_touched", i8),  # lists.touched[:n_touched]
    ("last_n_sched", i8),  # the previous decision's batch size (``lists.last_slots``)
    ("dormant_head", i8),  # dormant[:dormant_head] is no longer available
], align=True)

PARAMS = np.dtype([
    ("order", b1), ("chunk", b1), ("batch", b1),  # the three methods (ablations)
    ("gamma", f8), ("spill_groups", b1),
    ("budget_model", b1), ("budget_batch", b1),  # budget rule `model`, `batch` (else `paper`)
    ("min_budget", i8), ("cap", i8), ("s_pf", i8), ("t_pf", f8),
    ("era", b1), ("era_whole_request", b1), ("long_threshold", i8),
    ("late_is_urgent", b1), ("lost_last", b1),
    ("growth", i8),  # KV growth reserve (tokens)
    ("block_size", i8), ("total_blocks", i8),
    ("exact_kv", b1),  # the Oracle's exact KV plan (true output lengths; never preempts)
    # the cost model, when it is linear (LinearTerms' fields)
    ("cost_linear", b1), ("base_s", f8), ("per_token_s", f8), ("per_ctx_s", f8), ("per_attn_s", f8),
    ("cost_roofline", b1),  # the analytic model (its constants in ``STATE.roofline``)
], align=True)

INFO_KEYS = (
    "token_budget", "slo_min", "t_max", "budget_clamped_low", "budget_clamped_high",
    "n_candidates", "n_urgent", "n_late", "n_lost", "n_preempted", "n_scheduled", "n_decode",
    "n_prefill", "n_decode_skipped", "max_chunk", "n_cut_chunks", "n_groups", "era_active",
    "progress_fallback", "chunk_mean", "kv_free_blocks")
# The Oracle's own diagnostics, after AccelGen's in the same record (``clairvoyant`` is set once by
# its policy; the decision fills the rest). AccelGen's rows name only ``INFO_KEYS``.
ORACLE_INFO_KEYS = ("clairvoyant", "oracle_reforms", "oracle_excluded", "oracle_admissible")
INFO = np.dtype([(key, f8) for key in INFO_KEYS + ORACLE_INFO_KEYS])
INFO_INDEX = {key: i for i, key in enumerate(INFO_KEYS)}

BUDGET_TIME = np.dtype([
    ("forward", f8),  # forward_time(budget) (cost models without linear terms)
    ("full_batch", f8),  # latency of the full batch at this budget (this decision; NaN: unknown)
])

# The dormant queue is passed over in blocks of this many entries, skipping a block whose minima
# show that none of its requests can be admitted (``accelgen_decision._dormant_next``).
DORMANT_BLOCK = 64
DORMANT_MINIMA = np.dtype([
    # smallest admission need among the entries whose final KV is at most ``final_max`` (of all;
    # of those not long): computed when first needed for that final_max (the Oracle's admissible
    # KV, the same through a decision), anew after the block changes (``final_max`` -1)
    ("final_max", i8), ("need", i8), ("need_short", i8),
], align=True)

# "No cap" on admissions (max_num_seqs None): only ever decremented a few times.
NO_ADMISSION_CAP = 1 << 60


# One record of everything that is not per request (one array for the compiled call to take).
STATE = np.dtype([("step", STEP), ("ledger", LEDGER), ("outcome", OUTCOME), ("ask", ASK),
                  ("params", PARAMS), ("info", INFO), ("roofline", _record(RooflineTerms))],
                 align=True)


class DecisionArrays(NamedTuple):
    """What the compiled decision reads and writes (see the module docstring). Few arrays: in
    vLLM each one handed to compiled code costs a fraction of a microsecond, cache misses
    included, at every step."""

    requests: np.recarray  # the table's rows (REQUEST)
    cand: np.recarray  # CANDIDATE per request
    lists: np.recarray  # LISTS
    state: np.recarray  # STATE: step, ledger, outcome, ask, params, info
    times: np.recarray  # BUDGET_TIME per token budget
    scratch: np.ndarray  # int64 x 3 x capacity: sort keys (float64 bits), a permutation, a buffer
    active: np.ndarray  # the table's active slots, ascending
    dormant: np.recarray  # the table's dormant queue (DORMANT), in queue order
    dormant_minima: np.recarray  # DORMANT_MINIMA per DORMANT_BLOCK positions of ``dormant``
    dormant_gone: np.ndarray  # the table's ``gone``
    # (Oracle) the dormant requests' final KV in blocks: a Fenwick tree of their counts
    dormant_finals: np.ndarray


_new_tuple = tuple.__new__


def _records(dtype: np.dtype, n: int) -> np.recarray:
    return np.zeros(n, dtype=dtype).view(np.recarray)


class Workspace:
    """One policy's decision arrays, sized for its table (grown with it), and the loop that asks
    the cost model what the compiled decision cannot compute itself. The policy reads the outcome,
    the ask and the diagnostics through plain array views of the state record (a record's
    attribute access from Python costs a microsecond or two), the output lists through field views."""

    def __init__(self, table: RequestTable) -> None:
        state = np.zeros(1, STATE)
        self._step = state["step"]
        self._outcome = self._part(state, "outcome", np.int64)
        self._ask = state["ask"]
        self.info_values = self._part(state, "info", np.float64)
        times = _records(BUDGET_TIME, 1)
        self._full_batch = times.view(np.ndarray)["full_batch"]
        self.arrays = DecisionArrays(table.rows, _records(CANDIDATE, 0), _records(LISTS, 0),
                                     state.view(np.recarray), times, np.zeros(0, np.int64),
                                     table.active, table.dormant_queue,
                                     _records(DORMANT_MINIMA, 0), table.gone,
                                     np.zeros(1, np.int64))
        self.follow(table)  # (sizes the per-request arrays)
        self.configured: tuple[object, ...] = ()  # (cost model, pivot, KV) of ``configure``
        self.cap = 0
        self.exact_kv = False
        self._terms: LinearTerms | None = None

    @staticmethod
    def _part(state: np.ndarray, name: str, dtype: type) -> np.ndarray:
        """A sub-record of ``state`` whose fields all have ``dtype``, as a plain array."""
        sub, offset = STATE.fields[name][:2]  # type: ignore[index]
        return state.view(np.uint8)[offset:offset + sub.itemsize].view(dtype)

    # -- what stays the same between decisions -----------------------------------------------
    def configure(self, p: AccelGenParams, view: SchedulerView, exact_kv: bool) -> bool:
        """The fixed inputs, set again only for a new cost model, pivot or KV (returns whether it
        did): parameters, KV geometry, the token budget's clamps (``cap`` = S_pf x budget_cap,
        the minimum), and what the cost model offers compiled code (``CostModel.linear_terms``,
        followed at every call, or ``roofline_terms``; else forward times of the budgets
        0..cap + 1, and the cost model is asked for the rest)."""
        cost, pivot, kv = view.cost, view.pivot, view.kv
        key = self.configured
        if key and key[0] is cost and key[1] is pivot and key[2] is kv:
            self.use_cost(cost)
            return False
        self.configured = (cost, pivot, kv)
        self.cap = cap = max(1, int(pivot.s_pf * p.budget_cap))
        par = self.arrays.state[0].params
        par.order, par.chunk, par.batch = p.order, p.chunk, p.batch
        par.gamma, par.spill_groups = p.gamma, p.spill_groups
        par.budget_model, par.budget_batch = p.budget_rule == "model", p.budget_rule == "batch"
        par.min_budget, par.cap = min(max(1, p.min_budget or kv.block_size), cap), cap
        par.s_pf, par.t_pf = pivot.s_pf, pivot.t_pf
        par.era, par.era_whole_request = p.era, p.era_scope == "request"
        par.long_threshold = p.long_prompt_threshold
        par.late_is_urgent, par.lost_last = p.late_is_urgent, p.lost_last
        par.growth = kv.block_size if p.kv_growth_reserve is None else p.kv_growth_reserve
        par.block_size, par.total_blocks = kv.block_size, kv.num_total_blocks
        par.exact_kv = self.exact_kv = exact_kv
        self._terms = None
        self.use_cost(cost)
        roofline = cost.roofline_terms()
        par.cost_roofline = roofline is not None
        if roofline is not None:
            self.arrays.state.view(np.ndarray)["roofline"][0] = tuple(roofline)
        times = _records(BUDGET_TIME, cap + 2)
        self._full_batch = times.view(np.ndarray)["full_batch"]
        self._full_batch[:] = math.nan
        if not par.cost_linear:
            times.forward = [cost.forward_time(b) for b in range(cap + 2)]
        self.arrays = self.arrays._replace(times=times,
                                           dormant_finals=np.zeros(kv.num_total_blocks + 3, np.int64))
        return True

    def use_cost(self, cost: CostModel) -> None:
        """Follow the cost model's linear terms (an online model's refit replaces them)."""
        terms = cost.linear_terms()
        if terms is self._terms:
            return
        self._terms = terms
        par = self.arrays.state[0].params
        par.cost_linear = terms is not None
        if terms is not None:
            par.base_s, par.per_token_s, par.per_ctx_s, par.per_attn_s = terms

    def follow(self, table: RequestTable) -> None:
        """Use the table's current rows (reallocated when it grows) and per-request arrays as large."""
        n = table.capacity
        if n > len(self.arrays.cand):
            self.arrays = self.arrays._replace(
                cand=_records(CANDIDATE, n), lists=_records(LISTS, n),
                scratch=np.zeros(3 * n, np.int64),
                dormant_minima=_records(DORMANT_MINIMA, 2 * n // DORMANT_BLOCK + 1))
            lists = self.arrays.lists.view(np.ndarray)
            self.slots, self.tokens = lists["slots"], lists["tokens"]
            self.preempted, self.cut_chunks = lists["preempted"], lists["cut_chunks"]
        self.arrays = self.arrays._replace(requests=table.rows, active=table.active,
                                           dormant=table.dormant_queue, dormant_gone=table.gone)

    # -- one decision ------------------------------------------------------------------------
    def run(self, decide: Any, cost: CostModel, *step: Any) -> Outcome:
        """Run the compiled ``decide`` on ``step`` (``Step``'s fields, in order) to completion:
        while it returns a token budget, it needs the latency of the full batch at that budget
        (``ask``) from the cost model, and runs again from the start with it known."""
        if self.exact_kv:
            self._outcome.fill(0)  # the Oracle's counters accumulate over its passes
        self._step[0] = step
        arrays = self.arrays
        asked = []
        while (need := decide(arrays)) >= 0:
            self._full_batch[need] = cost.iteration_time(BatchShape(*self._ask[0].item()))
            asked.append(need)
        if asked:
            self._full_batch[asked] = math.nan
        # (``tuple.__new__``: the NamedTuple without its Python-level constructor, every step)
        return _new_tuple(Outcome, self._outcome.tolist())
