"""Forming one AccelGen batch: urgent requests with preemption (paper Algorithm 1),
SelectRequests, the multi-resource Euclidean selection (Algorithm 2), and the /Batch ablation's
in-order filling.

Every candidate is a slot of the ``RequestTable``. The batch is a ledger: remaining token budget
``a_c`` (tokens), free KV ``free_blocks`` (A_m = free_blocks x block_size tokens), KV promised to
running requests (``reserved_blocks``), the scheduled (slot, tokens) pairs and the preempted
slots. Nothing touches the real KV manager; the executor applies the returned decision.

KV promises. A running request is owed the blocks for its remaining prompt and its next token
(a decode: its next token), plus ``growth_reserve`` tokens of growth. AccelGen lets loose-TBT
decodes skip iterations; without the promise a skipped decode's next block goes to a newly
admitted prompt, and when the decode becomes urgent nothing is free and nobody may be preempted
for it (seen in testing: TBT misses of 0.3-2 s that vLLM, whose decodes allocate first every
step, does not have). So:

- a prompt holding no KV (new, or preempted for recompute) is admitted only when its whole
  remaining prompt plus its first token fits in the free KV nobody is owed. Cutting *new* prompts
  at free KV instead over-commits KV: two partially prefilled prompts each hold half of it,
  neither can finish, and preempting one makes it more urgent than the other (more to
  recompute), so they swap places every iteration (also seen in testing);
- a running prompt's chunk is cut exactly where the free KV not owed to others ends;
- a decode may take any free block.

The growth reserve (default one block per running request) is admission hysteresis: promising
only the next token, a preempted short request is readmitted as soon as one block frees, the
growing decodes need that block a few steps later, and the same short requests are preempted over
and over (seen on the quick config: 10x vLLM's preemptions).

Speed (SPEC 4.3: well under a millisecond with 1,000 waiting and 256 running requests) comes from
the structure of the Euclidean rule rather than from rescanning candidates per pick:

- a decode demands (1, 0) or (1, b) (b = block size); every other feasible item (D_c >= 1,
  D_m >= 0, within (A_c, A_m)) is at least as close to (A_c, A_m) as (1, 0), and every item with
  D_m >= b is at least as close as (1, b). So decodes are only picked once no prompt fits
  (except against a prompt chunk needing no new block, which is compared explicitly), then in
  bulk: the (1, b) class while blocks are free, then the (1, 0) class;
- a prompt holding no KV demands (c, ceil(c/b) b) for a chunk of c tokens: both coordinates grow
  with c, so among prompts that fit whole the closest is the longest (a bisection in a
  length-sorted list), and a prompt at least A_c long, cut to A_c, is closer still;
- the few partially prefilled running prompts are compared one by one.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable

import numpy as np

from accelgen.policies.accelgen_state import RequestTable

_FRESH, _PARTIAL, _DEC_B, _DEC_A = 0, 1, 2, 3
_NEVER = -(1 << 62)  # a threshold every ledger value meets


class BatchFormer:
    """One decision's batch under construction."""

    def __init__(self, table: RequestTable, *, block_size: int, free_blocks: int, token_budget: int,
                 rem: np.ndarray, is_dec: np.ndarray, key: np.ndarray,
                 victim_key: Callable[[], np.ndarray],
                 is_long: np.ndarray, available: np.ndarray, chunk: bool, era: bool,
                 era_owner: int, admissions_left: float, victim_floor: float = -math.inf,
                 victim_margin: float = 0.0, growth_reserve: int = 0,
                 total_blocks: int | None = None) -> None:
        n = table.n
        self.t = table
        self.bs = block_size
        self.free_blocks = free_blocks
        self.budget = token_budget
        self.a_c = token_budget
        self.rem = rem
        self.is_dec = is_dec
        self.key = key
        # A running request's key as a preemption victim: its slack once preempted, i.e.
        # including the recompute of everything it holds (its arrival under FCFS). Computed
        # on first use: most decisions preempt nobody.
        self._victim_key_fn = victim_key
        self._victim_key: np.ndarray | None = None
        # A prompt being admitted preempts only requests outside its slack group (victim key
        # above its key + ``victim_margin`` = gamma) that are not urgent once preempted (above
        # ``victim_floor`` = T_max): preempting a request about as urgent as the requester
        # trades one SLO miss for another plus a recompute, and on a full KV each victim then
        # preempts the next (seen in testing). See ``victim_min_key`` for running requests.
        self.victim_floor = victim_floor
        self.victim_margin = victim_margin
        self.is_long = is_long
        # Candidates still free to join: not scheduled, not preempted, allowed by ERA.
        self.available = available
        self.chunk = chunk
        self.era = era
        self.era_owner = era_owner  # slot of the long prompt in prefill, -1 if none
        self.admissions_left = admissions_left
        self.running = table.running[:n]
        # Tokens of growth promised to each running request beyond its pending tokens.
        self.growth = growth_reserve
        self.total_blocks = total_blocks if total_blocks is not None else 1 << 62
        self.computed = table.computed[:n]
        self.blocks = table.blocks[:n]
        # Per-candidate block needs; they do not change while the batch forms (only the
        # ledger's scalars do), so step 2's feasibility test is a few comparisons per group.
        # (Ceilings as (x + bs - 1) // bs with the constants folded: counts are non-negative.)
        comp, blk, bs, g = table.computed[:n], table.blocks[:n], block_size, growth_reserve
        blocks_next = (comp + bs) // bs  # blocks once the next token is in
        self.need1 = np.maximum(blocks_next - blk, 0)  # the next token
        self.owed_all = np.maximum((comp + rem + (g + bs - 1)) // bs - blk, 0)
        self.fresh_need = np.maximum(  # admission: see ``admission_need``
            (rem + bs) // bs, np.minimum((rem + (g + bs)) // bs, self.total_blocks))
        self.reserved_blocks = int(self.owed_all[self.running].sum())
        # A decode's change of the promised blocks when it runs: owed after its token (the next
        # one plus growth, beyond what it then holds) minus owed now (``owed_after`` - ``owed``).
        held = np.maximum(blk, blocks_next)
        self.dec_reserve_delta = np.maximum((comp + (g + bs + 1)) // bs - held, 0) - self.owed_all
        # Step 2's feasibility as two thresholds per candidate, so that a test is two comparisons
        # with the ledger's scalars (see ``feasible``): blocks that must be free, and blocks that
        # must be owed to nobody. A running prompt may use free blocks owed to nobody else plus
        # its own: need1 <= min(free, admissible + owed_all).
        self._need_free = np.where(self.running, self.need1, _NEVER)
        self._need_admissible = np.where(self.running, np.where(is_dec, _NEVER, self.need1 - self.owed_all),
                                         self.fresh_need)
        self.slots: list[int] = []
        self.tokens: list[int] = []
        self.cut_chunks: list[int] = []  # prompt chunks cut short by budget or KV (for L_c)
        self.preempted: list[int] = []
        self.member = np.zeros(n, dtype=bool)
        self._victims: list[int] | None = None

    @property
    def victim_key(self) -> np.ndarray:
        if self._victim_key is None:
            self._victim_key = self._victim_key_fn()
        return self._victim_key

    # -- KV arithmetic -------------------------------------------------------------------------
    @property
    def forward_size(self) -> int:
        return self.budget - self.a_c

    @property
    def admissible_blocks(self) -> int:
        """Free blocks owed to no running request."""
        return self.free_blocks - self.reserved_blocks

    def need_blocks(self, s: int, c: int) -> int:
        """Blocks ``s`` must add to hold KV for ``c`` more tokens."""
        need = -(-(int(self.computed[s]) + c) // self.bs) - int(self.blocks[s])
        return need if need > 0 else 0

    def owed(self, s: int) -> int:
        """Blocks promised to running ``s``: its remaining prompt or next token, plus growth."""
        return self.need_blocks(s, int(self.rem[s]) + self.growth)

    def owed_after(self, s: int, c: int) -> int:
        """Blocks ``s`` is owed after running ``c`` tokens: the rest of its prompt, or (when the
        chunk completes it) its next token."""
        bs = self.bs
        rem = int(self.rem[s])
        done = int(self.computed[s]) + c
        held = max(int(self.blocks[s]), -(-done // bs))
        nxt = (rem - c if c < rem else 1) + self.growth
        return max(0, -(-(done + nxt) // bs) - held)

    def admission_need(self, s: int) -> int:
        """Blocks a prompt holding no KV needs to start: all of it, its first token and the
        growth reserve (what it is owed once running), the reserve capped at the KV's size so
        that a request that fits in the KV alone can always start."""
        rem = int(self.rem[s])
        return max(self.need_blocks(s, rem + 1),
                   min(self.need_blocks(s, rem + 1 + self.growth), self.total_blocks))

    def prompt_room(self, s: int) -> int:
        """Tokens a running prompt may add: its last block's room plus the free blocks owed to
        nobody else."""
        room_last = max(0, int(self.blocks[s]) * self.bs - int(self.computed[s]))
        spare = min(self.free_blocks, self.admissible_blocks + self.owed(s))
        return room_last + max(0, spare) * self.bs

    # -- ledger --------------------------------------------------------------------------------
    def add(self, s: int, c: int) -> None:
        need = self.need_blocks(s, c)
        if self.running[s]:
            self.reserved_blocks -= self.owed(s)
        else:
            self.admissions_left -= 1
        self.reserved_blocks += self.owed_after(s, c)
        self.free_blocks -= need
        self.a_c -= c
        self.slots.append(s)
        self.tokens.append(c)
        self.member[s] = True
        self.available[s] = False
        if not self.is_dec[s] and c < int(self.rem[s]):
            self.cut_chunks.append(c)
        if self.era and self.is_long[s] and self.era_owner < 0:
            self.era_owner = s
            self._close_long()

    def _close_long(self) -> None:
        """ERA: no other long prompt starts while the owner is in prefill."""
        self.available &= ~self.is_long

    def era_blocked(self, s: int) -> bool:
        return self.era and bool(self.is_long[s]) and 0 <= self.era_owner != s

    # -- preemption ----------------------------------------------------------------------------
    def _victim_pool(self) -> list[int]:
        """Running requests, largest victim key (slack after preemption) first."""
        if self._victims is None:
            pool = np.flatnonzero(self.running)
            pool = pool[np.argsort(-self.victim_key[pool], kind="stable")]
            self._victims = pool.tolist()
        return self._victims

    def preempt(self, v: int) -> None:
        self.preempted.append(v)
        # As vLLM V1: nothing else is admitted in a step that preempted, so blocks freed for an
        # urgent request are not handed straight to a new prompt (preemption churn).
        self.admissions_left = min(self.admissions_left, 0)
        self.free_blocks += int(self.blocks[v])
        self.reserved_blocks -= self.owed(v)
        self.available[v] = False

    def free_kv(self, enough: Callable[[], bool], requester: int, *, min_key: float) -> None:
        """Preempt (recompute) the running requests with the largest slack until ``enough()``
        (Algorithm 1, lines 2-4), only those whose slack once preempted exceeds ``min_key``."""
        pool = self._victim_pool()
        while not enough() and pool:
            v = pool[0]
            if self.victim_key[v] <= min_key:
                return
            pool.pop(0)
            if v != requester and not self.member[v]:
                self.preempt(v)

    def victim_min_key(self, s: int) -> float:
        """Victims must have a larger slack than this: for a running request needing blocks, a
        larger slack once preempted than its own (evicting it would cost less); for a prompt
        being admitted, the gamma margin and the T_max floor."""
        if self.running[s]:
            return float(self.victim_key[s])
        return max(float(self.key[s]) + self.victim_margin, self.victim_floor)

    def add_decodes(self, u: np.ndarray | list[int]) -> None:
        """Add running decodes ``u`` (one token each) in one vectorised ledger update; the
        caller has checked that their blocks fit."""
        if len(u) == 0:
            return
        u = np.asarray(u, dtype=np.int64)
        self.free_blocks -= int(self.need1[u].sum())
        self.reserved_blocks += int(self.dec_reserve_delta[u].sum())
        self.a_c -= int(u.size)
        slots = u.tolist()
        self.slots.extend(slots)
        self.tokens.extend([1] * len(slots))
        self.member[u] = True
        self.available[u] = False

    # -- step 1: urgent requests ---------------------------------------------------------------
    def add_urgent(self, urgent: np.ndarray) -> None:
        """All urgent requests join (Algorithm 1, line 1). Urgent decodes, one token each, come
        first; urgent prompts then share the remaining budget in slack order, each chunk cut
        where the budget ends. A prompt's demand is elastic under dynamic chunking, so cutting
        it is the smallest way to remove a budget deficit; decodes beyond the budget are dropped
        largest slack first (lines 2-3). When KV runs out, running requests with a larger slack
        are preempted. ``urgent`` is in ascending slack order."""
        decodes, prompts = self._split_urgent(urgent)
        fit, short = self._urgent_decodes_fitting(decodes[: self.a_c])
        self.add_decodes(fit)
        for s in short:  # no free block left: preempt for each (Algorithm 1)
            if self.a_c <= 0:
                return
            self.force(s, min_key=self.victim_min_key(s))
        for s in prompts:
            if self.a_c <= 0:
                return
            if self.available[s] and not self.era_blocked(s):
                self.force(s, min_key=self.victim_min_key(s))

    def _split_urgent(self, urgent: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The available urgent requests: decodes and prompts, each in the order given."""
        u = urgent[self.available[urgent]]
        dec = self.is_dec[u]
        return u[dec], u[~dec].tolist()

    def _urgent_decodes_fitting(self, run: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Urgent decodes (in slack order) whose next token fits now: those needing no new
        block, and those needing one while blocks are free; and the rest."""
        need = self.need1[run] > 0
        with_block = need.nonzero()[0]
        fit = with_block[: self.free_blocks]  # in slack order, while blocks are free
        ok = ~need
        ok[fit] = True
        return run[ok], run[~ok].tolist()

    def force(self, s: int, *, min_key: float, oversize: bool = False) -> bool:
        """Add ``s`` with the largest chunk the budget allows, preempting running requests whose
        slack once preempted exceeds ``min_key`` if its KV does not fit. ``oversize`` lets a
        whole prompt exceed the budget (the /Chunk starvation guard)."""
        rem = int(self.rem[s])
        if self.is_dec[s]:
            c = 1
        elif oversize or not self.chunk:
            if rem > self.a_c and not oversize:
                return False
            c = rem
        else:
            c = min(rem, self.a_c)
        if c < 1:
            return False
        if not self.running[s]:  # admission: the whole remaining prompt must fit
            if self.admissions_left < 1:
                return False
            whole = self.admission_need(s)
            self.free_kv(lambda: whole <= self.admissible_blocks, s, min_key=min_key)
            if whole > self.admissible_blocks:
                return False
        elif self.is_dec[s]:
            need = self.need_blocks(s, 1)
            self.free_kv(lambda: need <= self.free_blocks, s, min_key=min_key)
            if need > self.free_blocks:
                return False
        else:
            self.free_kv(lambda: c <= self.prompt_room(s), s, min_key=min_key)
            room = self.prompt_room(s)
            if c > room:
                if not self.chunk or room < 1:
                    return False
                c = room  # dynamic chunking: cut where the free KV ends
        self.add(s, c)
        return True

    # -- step 2: SelectRequests ----------------------------------------------------------------
    def feasible(self, cand: np.ndarray) -> np.ndarray:
        """Candidates that could still join with at least their smallest piece of work (in the
        order given)."""
        if self.a_c <= 0 or cand.size == 0:
            return cand[:0]
        if not self.chunk:
            return self._feasible_whole(cand)
        ok = (self._need_free[cand] <= self.free_blocks) & \
            (self._need_admissible[cand] <= self.admissible_blocks)
        if self.admissions_left < 1:
            ok &= self.running[cand]
        return cand[ok]

    def _feasible_whole(self, cand: np.ndarray) -> np.ndarray:
        """``feasible`` for /Chunk: a prompt must fit whole, in the budget and in the KV."""
        running, dec, rem = self.running[cand], self.is_dec[cand], self.rem[cand]
        need1 = self.need1[cand]
        if self.admissions_left < 1:
            fresh_ok = np.zeros(cand.size, dtype=bool)
        else:
            fresh_ok = (self.fresh_need[cand] <= self.admissible_blocks) & (rem <= self.a_c)
        dec_ok = need1 <= self.free_blocks
        spare = np.minimum(self.free_blocks, self.admissible_blocks + self.owed_all[cand])
        t, bs = self.t, self.bs
        comp, blk = t.computed[cand], t.blocks[cand]
        whole = np.maximum(-(-(comp + rem) // bs) - blk, 0)  # blocks for all pending tokens
        prompt_ok = (whole <= spare) & (rem <= self.a_c)
        return cand[np.where(running, np.where(dec, dec_ok, prompt_ok), fresh_ok)]

    def select_euclidean(self, group: np.ndarray) -> None:
        """Algorithm 2 on one slack group (in key order): repeatedly add the candidate whose
        (D_c, D_m) is closest to (A_c, A_m) among those that fit; ties go to the smaller key."""
        if len(group) == 1:  # common with few requests; the loop below would pick it alone
            self._add_alone(int(group[0]))
            return
        f_slot, f_rem, f_key, partial, dec_b, dec_a = self._euclid_pools(group)
        self._euclid_loop(f_slot, f_rem, f_key, partial, {_DEC_B: dec_b, _DEC_A: dec_a})

    def _euclid_pools(self, group: np.ndarray) -> tuple[list[int], list[int], list[float], list[int],
                                                        list[int], list[int]]:
        """The group's candidates by class: prompts holding no KV by remaining length (stable)
        with their lengths and keys, running prompts, decodes needing a block and decodes needing
        none (both in key order)."""
        dec = self.is_dec[group]
        running = self.running[group]
        fresh = group[~running]
        decs = group[dec]
        with_block = self.need1[decs] > 0
        # ``group`` is in key order, so each decode class already is.
        fresh = fresh[self.rem[fresh].argsort(kind="stable")]
        return (fresh.tolist(), self.rem[fresh].tolist(), self.key[fresh].tolist(),
                group[running & ~dec].tolist(), decs[with_block].tolist(),
                decs[~with_block].tolist())

    def _euclid_loop(self, f_slot: list[int], f_rem: list[int], f_key: list[float],
                     partial: list[int], dec_pools: dict[int, list[int]]) -> None:
        bs, key = self.bs, self.key
        # Distances are compared squared: exact integers, the same order as the Euclidean
        # distance's and no rounding to tell apart (or tie) two candidates.
        best_d: float
        while self.a_c > 0:
            a_c, a_m = self.a_c, self.free_blocks * bs
            best_d, best_k, best = math.inf, math.inf, None
            fresh_pick = self._best_fresh(f_rem, f_key)
            if fresh_pick is not None:
                j, c = fresh_pick
                m = -(-c // bs) * bs
                best_d, best_k, best = (a_c - c) ** 2 + (a_m - m) ** 2, f_key[j], (_FRESH, j, c)
            for pi, s in enumerate(partial):
                c = self._prompt_chunk(s)
                if c < 1:
                    continue
                d = (a_c - c) ** 2 + (a_m - self.need_blocks(s, c) * bs) ** 2
                k = float(key[s])
                if d < best_d or (d == best_d and k < best_k):
                    best_d, best_k, best = d, k, (_PARTIAL, pi, c)
            prompt_fits = best is not None
            # Decodes: (1, b) while a block is free, else (1, 0).
            kind = _DEC_B if dec_pools[_DEC_B] and self.free_blocks >= 1 else _DEC_A
            if dec_pools[kind]:
                d = (a_c - 1) ** 2 + (a_m - (bs if kind == _DEC_B else 0)) ** 2
                k = float(key[dec_pools[kind][0]])
                if d < best_d or (d == best_d and k < best_k):
                    best = (kind, 0, 1)
            if best is None:
                return
            kind, j, c = best
            if kind == _FRESH:
                s = f_slot[j]
                del f_rem[j], f_key[j], f_slot[j]
                self.add(s, c)
                if self.era and self.era_owner == s:  # other long prompts leave the group
                    keep = [i for i, x in enumerate(f_slot) if not self.is_long[x]]
                    f_rem = [f_rem[i] for i in keep]
                    f_key = [f_key[i] for i in keep]
                    f_slot = [f_slot[i] for i in keep]
            elif kind == _PARTIAL:
                self.add(partial.pop(j), c)
            elif prompt_fits:  # a decode beat a prompt chunk needing no new block
                self.add(dec_pools[kind].pop(0), 1)
            else:
                self._take_decodes(dec_pools[_DEC_B], dec_pools[_DEC_A])
                return

    def _add_alone(self, s: int) -> None:
        """``select_euclidean`` on a one-candidate group that ``feasible`` let through: a decode
        runs, a running prompt takes ``_prompt_chunk``, a new prompt ``_best_fresh``'s chunk."""
        if self.is_dec[s]:
            self.add(s, 1)
        elif self.running[s]:
            c = self._prompt_chunk(s)
            if c >= 1:
                self.add(s, c)
        else:
            pick = self._best_fresh([int(self.rem[s])], [float(self.key[s])])
            if pick is not None:
                self.add(s, pick[1])

    def _best_fresh(self, f_rem: list[int], f_key: list[float]) -> tuple[int, int] | None:
        """Closest prompt holding no KV, as (index, chunk): one at least A_c long that may be
        admitted is cut to A_c; otherwise the longest that fits whole (smaller key on ties)."""
        if not f_rem or self.admissions_left < 1:
            return None
        # f_rem[:hi] may be admitted (whole prompt, first token and growth reserve fit)
        free = self.admissible_blocks
        limit = (free * self.bs - 1 - self.growth if free < self.total_blocks
                 else self.total_blocks * self.bs - 1)
        hi = bisect_right(f_rem, limit)
        if hi == 0:
            return None
        a_c = self.a_c
        if self.chunk and f_rem[hi - 1] >= a_c:
            lo = bisect_left(f_rem, a_c, 0, hi)
            return min(range(lo, hi), key=f_key.__getitem__), a_c
        j = bisect_right(f_rem, a_c, 0, hi) - 1
        if j < 0:
            return None
        r, i = f_rem[j], j - 1
        while i >= 0 and f_rem[i] == r:  # equal demand: the smaller key
            if f_key[i] < f_key[j]:
                j = i
            i -= 1
        return j, r

    def _prompt_chunk(self, s: int) -> int:
        """Chunk of running prompt ``s`` that fits the budget and its KV room (0: none)."""
        rem = int(self.rem[s])
        if self.chunk:
            return min(rem, self.a_c, self.prompt_room(s))
        return rem if rem <= self.a_c and rem <= self.prompt_room(s) else 0

    def _take_decodes(self, dec_b: list[int], dec_a: list[int]) -> None:
        """No prompt fits any more: the Euclidean order is now all (1, b) decodes while blocks
        are free, then (1, 0) decodes, each class by key."""
        k_b = min(len(dec_b), self.a_c, self.free_blocks)
        self.add_decodes(dec_b[:k_b])
        k_a = min(len(dec_a), self.a_c)
        self.add_decodes(dec_a[:k_a])

    def fill_in_order(self, group: np.ndarray) -> None:
        """/Batch ablation: take candidates in key order, skipping those that do not fit; a prompt
        is cut where the budget or free KV ends."""
        group = group[np.argsort(self.key[group], kind="stable")]
        for s in group.tolist():
            if self.a_c <= 0:
                return
            if not self.available[s] or self.era_blocked(s):
                continue
            if self.is_dec[s]:
                if self.need_blocks(s, 1) <= self.free_blocks:
                    self.add(s, 1)
            elif self.running[s]:
                c = self._prompt_chunk(s)
                if c >= 1:
                    self.add(s, c)
            elif self.admissions_left >= 1 and self.admission_need(s) <= self.admissible_blocks:
                rem = int(self.rem[s])
                c = min(rem, self.a_c) if self.chunk else (rem if rem <= self.a_c else 0)
                if c >= 1:
                    self.add(s, c)
