"""Paged KV-cache accounting (block counts per request, vLLM style).

Only counts are tracked: a policy or the simulator needs to know how many blocks a request holds
and how many are free, never which physical block is which.
"""

from __future__ import annotations

from accelgen.core.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def tokens_fitting(req: Request, free_blocks: int, block_size: int) -> int:
    """How many more tokens of ``req`` fit in its own last block plus ``free_blocks``."""
    slack_in_last = req.num_blocks * block_size - req.num_computed_tokens
    return max(0, slack_in_last) + free_blocks * block_size


def never_fits_reason(prompt_len: int, output_len: int, *, max_model_len: int,
                      num_blocks: int, block_size: int) -> str:
    """Why a request can never run on this deployment (SPEC section 2), or "" if it can.

    One rule for the simulator and the vLLM replay, so both reject the same requests.
    """
    if prompt_len >= max_model_len:
        return (f"prompt ({prompt_len} tokens) leaves no room for output within "
                f"max_model_len {max_model_len}")
    need = prompt_len + output_len
    if blocks_for(need, block_size) > num_blocks:
        return (f"sequence ({need} tokens) exceeds total KV capacity "
                f"({num_blocks * block_size} tokens)")
    return ""


class KVQueries:
    """The read-only KV questions a policy asks, over ``block_size``, ``num_free_blocks`` and
    ``watermark_blocks``; shared by the simulator's manager and the vLLM adapter's view."""

    __slots__ = ()
    block_size: int
    num_free_blocks: int
    watermark_blocks: int

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Extra blocks needed to hold KV for ``num_new_tokens`` more computed tokens."""
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - req.num_blocks
        return need if need > 0 else 0

    def free_tokens_for(self, req: Request) -> int:
        """How many more tokens of ``req`` fit in its own last block plus all free blocks."""
        return tokens_fitting(req, self.num_free_blocks, self.block_size)

    def can_admit(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks - self.watermark_blocks


class BlockManager(KVQueries):
    """Device KV blocks plus an optional host swap space.

    ``watermark_blocks`` are kept free at admission time only (vLLM V0 / Sarathi 1 % watermark);
    growth of running requests may use them.
    """

    __slots__ = ("block_size", "num_free_blocks", "num_free_swap_blocks", "num_swap_blocks",
                 "num_total_blocks", "watermark_blocks")

    def __init__(self, num_blocks: int, block_size: int, *, watermark: float = 0.0,
                 num_swap_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need positive num_blocks and block_size, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks
        self.watermark_blocks = int(watermark * num_blocks)
        self.num_swap_blocks = num_swap_blocks
        self.num_free_swap_blocks = num_swap_blocks

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_total_blocks * self.block_size

    # -- mutations -----------------------------------------------------------------------------
    def allocate(self, req: Request, num_new_tokens: int) -> None:
        need = self.blocks_needed(req, num_new_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(
                f"KV overflow: request {req.req_id} needs {need} blocks, {self.num_free_blocks} free")
        self.num_free_blocks -= need
        req.num_blocks += need

    def reserve(self, req: Request, num_tokens: int) -> None:
        """Hold blocks for ``num_tokens`` tokens up front (Orca's max-length reservation)."""
        need = blocks_for(num_tokens, self.block_size) - req.num_blocks
        if need > self.num_free_blocks:
            raise RuntimeError(
                f"KV overflow: request {req.req_id} reserves {need} blocks, {self.num_free_blocks} free")
        if need > 0:
            self.num_free_blocks -= need
            req.num_blocks += need

    def free(self, req: Request) -> None:
        self.num_free_blocks += req.num_blocks
        req.num_blocks = 0
        self.num_free_swap_blocks += req.num_swapped_blocks
        req.num_swapped_blocks = 0

    def swap_out(self, req: Request) -> int:
        n = req.num_blocks
        if n > self.num_free_swap_blocks:
            raise RuntimeError(f"swap space full: request {req.req_id} needs {n} host blocks")
        self.num_free_swap_blocks -= n
        self.num_free_blocks += n
        req.num_swapped_blocks, req.num_blocks = n, 0
        return n

    def swap_in(self, req: Request) -> int:
        n = req.num_swapped_blocks
        if n > self.num_free_blocks:
            raise RuntimeError(f"KV overflow: swap-in of request {req.req_id} needs {n} blocks")
        self.num_free_blocks -= n
        self.num_free_swap_blocks += n
        req.num_blocks, req.num_swapped_blocks = n, 0
        return n
