"""The records AccelGen's compiled decision reads and writes, and its named constants. A record that
compiled functions take is a class of annotated fields turned into a numpy dtype (``record``: numba
compiles its fields as attributes, the class types the arguments); the NamedTuples group the arrays
the functions hand on. Nothing here imports numba (``docs/accelgen.md``, *How it runs*)."""

from __future__ import annotations

from typing import NamedTuple, get_type_hints

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.analytic import RooflineTerms
from accelgen.costmodel.calibrated import CalibratedConsts

NO_SLOT = -1  # no request (no ERA holder, no oversized prompt), no position in the dormant queue
UNKNOWN = -1  # a KV need this decision has not derived yet
NO_ASK = -1  # a step of the decision completed (else it returns a budget to ask the cost model about)
LOST_OFFSET = 1e9  # a lost prompt's queue key is this plus its arrival (after every on-track key)
UNCOUNTED = -1  # ``final`` of a dormant entry the decision has not derived yet
STALE = -1  # ``final_max`` of a dormant block whose minima are computed again when next needed
NO_LIMIT = 1 << 62  # a block count no request reaches
HIDDEN = NO_LIMIT + 1  # (Oracle) the need of an over-admitted dormant entry: never searched for
NO_ADMISSION_CAP = 1 << 60  # max_num_seqs None: admissions left is only ever decremented a few times
DORMANT_BLOCK = 64  # the dormant queue is searched in blocks of this many entries (their minima)
FOR_ADMISSION, FOR_DECODE, FOR_CHUNK = 0, 1, 2
# Where a decode run's decisions stopped (``DecodeRun.stop``): after every step, at a step
# whose decision is complete and differs, at a step whose decision waits on the cost model, before
# a step whose decision the closed loop's take-in of the step before may change.
RUN_ALL, RUN_DECIDED, RUN_ASKS, RUN_OBSERVES = 0, 1, 2, 3
# Two evaluations of one formula (the decision's compiled one, the simulator's) may round apart;
# a measured / predicted ratio this close to 1 is an exact prediction (``closed_loop``).
EXACT_RATIO = 1e-9  # what a preemption makes room for (``preempt.room``)
# The interquartile range of a normal distribution in standard deviations: the closed loop's robust
# spread of its log errors (``closed_loop``).
IQR_SD = 1.3489795003921634
# What the closed loop's take-in of a decode run's step changed (``loop_step.take_in``): nothing the
# plan reads, or the correction or the fit (the plan's scales follow).
LOOP_SAME, LOOP_CHANGED = 0, 1
# The demand class of step 2's closest candidate (``batch.select_euclidean``).
NO_PICK, PICK_FRESH, PICK_PROMPT, PICK_DECODE_BLOCK, PICK_DECODE_FREE = -1, 0, 1, 2, 3
i8, f8, b1 = np.int64, np.float64, np.bool_


def record(fields: type) -> np.dtype:
    """The numpy record type of a class of annotated ``int``, ``float`` and ``bool`` fields."""
    kinds = {int: i8, float: f8, bool: b1}
    return np.dtype([(name, kinds[t]) for name, t in get_type_hints(fields).items()], align=True)


class RequestRow:
    """One live request in the table (``table.RequestTable``)."""

    req_id: int
    prompt: int
    n_out: int  # output tokens emitted
    computed: int  # tokens whose KV is computed
    blocks: int  # KV blocks held
    pred_out: int  # S_g: predicted output length (offline JCT plan)
    true_out: int  # true output length (clairvoyant policies only; else 0)
    arrival: float
    ttft: float
    tbt: float
    jct: float
    last_tok: float  # time of the last output token
    deadline: float  # of the next output token
    off_first: float  # offline: planned time of the first token (NaN until planned)
    off_step: float  # offline: planned time per later token (allowance T_r + T_max)
    running: bool  # holds KV (vLLM's running queue)
    online: bool  # TTFT/TBT SLOs (else a JCT SLO)
    lost: bool  # online and a token already missed its deadline (request SLO lost)
    dormant: bool  # in the dormant queue (else among the active slots)


class Candidate:
    """A candidate's columns for one pass over the candidates."""

    rem: int  # tokens to compute before its next output (prompt + outputs - computed)
    total: int  # prompt + outputs: what a recompute re-prefills
    to_deadline: float  # deadline of its next output - now
    n_chunks: float  # N_ck: iterations its next output still needs (1 for a decode)
    slo_iter: float  # per-iteration SLO: TBT of an online decode, else to_deadline / N_ck
    slack: float
    key: float  # queue order: slack (lost prompts last, FCFS), or arrival under /Order
    victim_key: float  # running: preempted largest first (``preempt.victim_key``)
    next_blocks: int  # KV blocks its next token needs (UNKNOWN until needed, also the next two)
    owed: int  # promised to it while running
    admission_blocks: int  # its admission needs
    is_decode: bool
    online_decode: bool
    is_long: bool  # ERA: a long prompt
    lost: bool  # its request-level SLO is lost (decision 11)
    eligible: bool  # may join this decision (ERA's holder, the Oracle's exact KV plan)
    available: bool  # eligible, not yet scheduled or preempted, not shut out by an oversized prompt
    member: bool  # in the batch
    urgent: bool
    counted: bool  # its per-iteration SLO counts toward SLO_min
    stamp: int  # the pass (``Ledger.pass_id``) these columns are of
    over: bool  # (Oracle) over-admitted in this decision (cleared when it ends)


class Step:
    """The inputs of one decision (written by ``Workspace.run`` in this order)."""

    n: int  # live requests (rows of the table)
    now: float
    chunk_mean: float  # L_c
    era_owner: int  # slot of the long prompt holding ERA (NO_SLOT)
    prev_budget: int  # the previous decision's token budget
    free_blocks: int
    admissions_left: int  # new requests it may admit (max_num_seqs)
    plan_only: bool  # stop after the plan (explain)
    n_active: int  # active slots
    n_dormant: int  # entries of the dormant queue, from ``dormant_lo`` on
    dormant_lo: int
    dirty_lo: int  # positions [dirty_lo, dirty_hi) of the dormant queue changed since the last step
    dirty_hi: int
    n_gone: int  # counted entries that left the queue (their final KV in ``gone``)
    reindex: bool  # derive every dormant entry again (new parameters, or the table grew)


class Ledger:
    """The decision being made: the plan, the batch under construction, where its searches are."""

    n_decodes: int  # the running batch (T_max): its decodes, their KV context,
    decode_ctx: int
    prefill_ctx: int  # the longest running prompt's context
    t_max: float
    slo_min: float
    clamped_low: bool
    clamped_high: bool
    budget: int  # S_b (lowered by step 2 for a tighter group)
    budget_left: int  # A_c: tokens left in the budget
    kv_free: int  # free blocks (A_m / block size)
    reserved: int  # free blocks promised to running requests
    admissions: int  # admissions left in this step
    n_sched: int  # the batch (``Batch.slots[:n_sched]``), its victims and cut chunks
    n_preempted: int
    n_cut: int
    era_owner: int  # the long prompt holding ERA (NO_SLOT)
    era_owner_start: int  # the holder as the pass began (eligibility)
    oracle_admissible: int  # (Oracle) free blocks not promised to the running requests' final KV
    n_urgent: int
    n_order: int
    order_head: int  # order[:order_head] is no longer available
    n_victims: int  # UNKNOWN until the victims are first needed
    victim_head: int  # victims[:victim_head] were considered
    n_groups: int
    fallback: bool  # the deadlock breaker ran
    pass_id: int  # counts the passes over the candidates (``Candidate.stamp``)
    oversize: int  # /Chunk: the oversized head prompt (NO_SLOT)
    n_touched: int  # dormant requests woken in this pass
    last_n_sched: int  # the previous decision's batch size (``Batch.last_slots``)
    dormant_head: int  # dormant[:dormant_head] is no longer available
    t_limit: float  # the latency the batch is planned within: SLO_min (inf: none, or unreachable)
    pf_tokens: int  # the batch formed so far, as the cost model prices it (``BatchShape``)
    pf_seqs: int
    pf_attn: float
    dec_seqs: int
    dec_ctx: int


class OracleCounts:
    """The Oracle's counters, over the passes of a decision (the policy zeroes them first)."""

    excluded: int  # requests its exact KV plan kept out
    reforms: int  # passes that found over-admissions
    n_over: int  # over-admitted requests so far (``Oracle.over``)


class DecodeRun:
    """A run of decode steps decided in one call (``decode_run.decode_run``)."""

    batch: int  # requests of the batch (the head of ``Batch.slots``)
    block_size: int
    first: int  # the steps to decide: ``first`` to ``last`` (exclusive)
    last: int
    exact_only: bool  # the closed loop at rest: stop before a step after an inexact prediction
    observes: bool  # the closed loop takes in each step before the next one's decision (``loop_step``)
    planned_at: int  # (``exact_only``, ``observes``) the position of the predicted latency in ``info``
    stop: int  # RUN_ALL, RUN_DECIDED, RUN_ASKS or RUN_OBSERVES
    need: int  # (RUN_ASKS) the token budget whose full batch's latency the decision waits on
    budget: int  # the last step decided the same: its token budget
    era_owner: int  # and its ERA holder (a slot, NO_SLOT)


class LoopState:
    """The closed loop's state that a decode run's steps take in (``closed_loop.ClosedLoop``, whose
    attributes of the same names these are; ``i``, ``n``, ``since``: its error window's)."""

    correction: float
    margin: float
    median: float
    sd: float
    quantile: float
    z: float
    lsum: float  # output tokens of the online requests in the length window
    weight: float
    target: float
    i: int
    n: int
    since: int
    observed: int
    ln: int  # online requests in the length window
    every: int


class Outcome:
    """What the policy reads back (all int64, in this order: ``AccelGenPolicy._decision``)."""

    n_sched: int
    n_preempted: int
    n_cut: int
    budget: int
    era_owner: int  # the long prompt holding ERA after this decision (NO_SLOT)
    same_batch: int  # 1: the previous decision's batch again and nothing else (``decide._finish``)


class Params:
    """The fixed inputs (``Workspace.configure``)."""

    order: bool  # the three methods (ablations)
    chunk: bool
    batch: bool
    gamma: float
    spill_groups: bool
    budget_model: bool  # budget rule `model`, `batch` (else `paper`)
    budget_batch: bool
    min_budget: int
    cap: int
    s_pf: int
    t_pf: float
    era: bool
    era_whole_request: bool
    long_threshold: int
    late_is_urgent: bool
    lost_last: bool
    growth: int  # KV growth reserve (tokens)
    block_size: int
    total_blocks: int
    exact_kv: bool  # the Oracle's exact KV plan (true output lengths; never preempts)
    cost_linear: bool  # a linear cost model, its LinearTerms' four fields:
    base_s: float
    per_token_s: float
    per_ctx_s: float
    per_attn_s: float
    cost_roofline: bool  # the analytic model (its constants in ``Cost.roofline``)
    cost_calibrated: bool  # the calibrated model (its constants in ``Cost.calibrated``)
    time_scale: float  # every predicted latency x this (the closed loop's correction; 1)
    tbt_shrink: float  # an online decode's TBT SLO x this in the plan (the closed loop's 1 / (1 + margin); 1)
    # The closed loop's fit of one iteration's log error (all 0 in the open loop): its median and
    # spread, the standard normal quantile of a deadline's share of the risk, the risk (1 - target)
    err_median: float
    err_sd: float
    err_z: float
    risk: float


class DormantEntry:
    """A dormant request in queue order (key, then slot): the table writes its key (arrival +
    LOST_OFFSET) and slot, and ``final`` = UNCOUNTED; the decision derives the rest (``dormant``)."""

    key: float
    slot: int
    need: int  # blocks it needs to start
    final: int  # (Oracle) blocks it holds at the end
    long: bool  # ERA: a long prompt


class DormantMinima:
    """Per DORMANT_BLOCK entries: the smallest admission need among those whose final KV is at most
    ``final_max`` (the Oracle's admissible KV; STALE after a change), of all and of those not long."""

    final_max: int
    need: int
    need_short: int


class AccelGenInfo:
    """The diagnostics, all float64 (``docs/accelgen.md``, *Diagnostics*)."""

    token_budget: float
    slo_min: float
    t_max: float
    budget_clamped_low: float
    budget_clamped_high: float
    n_candidates: float
    n_urgent: float
    n_late: float
    n_lost: float
    n_preempted: float
    n_scheduled: float
    n_decode: float
    n_prefill: float
    n_decode_skipped: float
    max_chunk: float
    n_cut_chunks: float
    n_groups: float
    era_active: float
    progress_fallback: float
    chunk_mean: float
    kv_free_blocks: float
    t_planned: float  # the cost model's latency of the batch formed (NaN: a model the decision asks)
    plan_slo: float  # the latency it was planned within (NaN: none)
    planned_overrun: float  # t_planned x time_scale > plan_slo
    time_scale: float


class Info(AccelGenInfo):
    """The record the decision writes: AccelGen's diagnostics, then the Oracle's own."""

    clairvoyant: float
    oracle_reforms: float
    oracle_excluded: float
    oracle_admissible: float


# Per token budget: forward_time (without linear terms), the full batch's latency (NaN: unknown).
BUDGET_TIME = np.dtype([("forward", f8), ("full_batch", f8)])
INFO_KEYS = tuple(get_type_hints(AccelGenInfo))
ORACLE_INFO_KEYS = tuple(get_type_hints(Info))[len(INFO_KEYS):]
INFO_INDEX = {key: i for i, key in enumerate(INFO_KEYS)}
INFO, DORMANT, DORMANT_MINIMA = record(Info), record(DormantEntry), record(DormantMinima)
REQUEST, CANDIDATE, STEP, OUTCOME = record(RequestRow), record(Candidate), record(Step), record(Outcome)
DECODE_RUN, LOOP_STATE = record(DecodeRun), record(LoopState)
# Everything that is not per request, one record (one array for the compiled call to take).
STATE = np.dtype([("step", STEP), ("ledger", record(Ledger)), ("oracle", record(OracleCounts)),
                  ("outcome", OUTCOME), ("ask", record(BatchShape)), ("params", record(Params)),
                  ("info", INFO), ("roofline", record(RooflineTerms)),
                  ("calibrated", record(CalibratedConsts))], align=True)


class DecisionArrays(NamedTuple):
    """What the compiled ``decide`` takes: few arrays (in vLLM each one handed to compiled code
    costs a fraction of a microsecond, every step)."""

    requests: np.recarray  # the table's rows (REQUEST)
    cand: np.recarray  # CANDIDATE per request
    lists: np.ndarray  # int64, a row per name of LISTS
    state: np.ndarray  # STATE
    times: np.ndarray  # BUDGET_TIME per token budget
    active: np.ndarray  # the table's active slots, ascending
    dormant: np.ndarray  # the table's dormant queue (DORMANT)
    minima: np.ndarray  # DORMANT_MINIMA per DORMANT_BLOCK positions of ``dormant``
    gone: np.ndarray  # the table's ``gone``
    finals: np.ndarray  # (Oracle) a Fenwick tree of the dormant requests' final KV


class Candidates(NamedTuple):
    """The requests of one decision: rows and columns by slot, the active slots; sort scratch."""

    req: np.recarray  # RequestRow
    cand: np.recarray  # Candidate (``cand.key`` etc.: a column)
    active: np.ndarray
    now: float
    chunk_mean: float  # L_c
    # ``rank.sort_slots``' scratch: the gathered keys and their merge buffer (float64 bits in
    # int64 rows), and the slots' merge buffer
    sort_keys: np.ndarray
    sort_key_tmp: np.ndarray
    sort_slot_tmp: np.ndarray


class Dormant(NamedTuple):
    """The dormant queue ``queue[lo:hi]``, its blocks' minima, the final KV of the entries gone
    since the last decision and (Oracle) a count of those there; the requests woken this pass."""

    queue: np.ndarray
    minima: np.ndarray
    gone: np.ndarray
    finals: np.ndarray
    lo: int
    hi: int
    touched: np.ndarray


class Queue(NamedTuple):
    """The orders the decision takes candidates in (slots), and the dormant queue."""

    urgent: np.ndarray  # urgent candidates by slack
    order: np.ndarray  # step 2's queue: what step 1 left, by key
    group: np.ndarray  # the current slack group
    short: np.ndarray  # urgent decodes whose block needs a preemption
    fallback: np.ndarray  # the deadlock breaker's candidates
    dormant: Dormant


class Pools(NamedTuple):
    """A slack group by demand class (``batch.select_euclidean``)."""

    fresh: np.ndarray  # prompts holding no KV, by remaining length; that length and their key
    fresh_rem: np.ndarray
    fresh_key: np.ndarray
    partial: np.ndarray  # running prompts
    dec_block: np.ndarray  # decodes needing a new block
    dec_free: np.ndarray  # decodes needing none


class Batch(NamedTuple):
    """The batch being formed (its counts in the ledger) and the previous decision's."""

    slots: np.ndarray
    tokens: np.ndarray
    preempted: np.ndarray
    cuts: np.ndarray  # prompt chunks cut short by budget or KV (for L_c)
    victims: np.ndarray  # running requests, largest victim key first
    last_slots: np.ndarray
    last_tokens: np.ndarray


class Oracle(NamedTuple):
    """The Oracle's counters, its over-admitted requests and their dormant positions (NO_SLOT)."""

    counts: OracleCounts
    over: np.ndarray
    over_at: np.ndarray


class Budget(NamedTuple):
    """A token budget (``budget.token_budget``): whether it was clamped, or what to ask first."""

    tokens: int
    low: bool  # clamped to the minimum
    high: bool  # clamped to the cap
    ask: int  # NO_ASK, or a budget whose full-batch latency the cost model must give first


class Cost(NamedTuple):
    """What the decision knows of the cost model besides its linear terms (in ``Params``)."""

    times: np.ndarray  # BUDGET_TIME per token budget
    roofline: RooflineTerms  # (a record of its fields)
    ask: BatchShape  # the batch to ask about (a record of its fields)
    calibrated: CalibratedConsts  # (a record of its fields)


# The decision's slot lists: rows of one int64 array (``Workspace``; one array to hand to compiled
# code), in the order of these fields (``decide.decide`` unpacks them).
LISTS = (*Batch._fields, *Queue._fields[:-1], *Pools._fields, *Dormant._fields[-1:],
         *Oracle._fields[1:], *Candidates._fields[-3:])
