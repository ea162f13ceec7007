"""Which iteration shapes a profile measures.

A shape is one iteration's batch composition in the profile CSV's terms (see
``accelgen.costmodel.table``): ``prefill_tokens`` new prompt tokens split as evenly as possible into
``prefill_seqs`` chunks, each over ``prefill_ctx`` tokens of prior context, plus ``decode_seqs``
decoding sequences whose contexts sum to ``decode_ctx`` (the simulator's convention: a decode's
context is the tokens already in its KV cache, not counting the token being generated).
"""

from __future__ import annotations

from dataclasses import dataclass

from accelgen.costmodel.table import ProfileRow, standard_grid


@dataclass(frozen=True, slots=True)
class Shape:
    prefill_tokens: int = 0
    prefill_seqs: int = 0
    prefill_ctx: int = 0
    decode_seqs: int = 0
    decode_ctx: int = 0

    def __post_init__(self) -> None:
        if self.forward_size <= 0:
            raise ValueError(f"empty shape {self}")
        if (self.prefill_tokens > 0) != (self.prefill_seqs > 0) or \
                self.prefill_seqs > self.prefill_tokens:
            raise ValueError(f"{self}: prefill_seqs must be in 1..prefill_tokens when there is "
                             "prefill, 0 otherwise")
        if self.decode_ctx < self.decode_seqs or (self.decode_seqs == 0 and self.decode_ctx):
            raise ValueError(f"{self}: decode_ctx is the total context of the decodes (>= 1 each)")
        if self.prefill_tokens == 0 and self.prefill_ctx:
            raise ValueError(f"{self}: prefill_ctx without prefill tokens")

    @property
    def forward_size(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def kind(self) -> str:
        if self.prefill_tokens and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"

    @property
    def is_base(self) -> bool:
        """One fresh prefill chunk: a point of the forward-size curve the pivot is read from."""
        return self.kind == "prefill" and self.prefill_seqs == 1 and self.prefill_ctx == 0

    def chunks(self) -> list[int]:
        """Sizes of the prefill chunks (as ``ProfileRow.shape`` splits them)."""
        if not self.prefill_seqs:
            return []
        base, extra = divmod(self.prefill_tokens, self.prefill_seqs)
        return [base + (1 if i < extra else 0) for i in range(self.prefill_seqs)]

    def decode_contexts(self) -> list[int]:
        """Per-sequence contexts of the decodes (as even as possible)."""
        if not self.decode_seqs:
            return []
        base, extra = divmod(self.decode_ctx, self.decode_seqs)
        return [base + (1 if i < extra else 0) for i in range(self.decode_seqs)]

    def max_len(self) -> int:
        """Longest sequence (context + new tokens) the shape needs."""
        pf = max(self.chunks(), default=0) + self.prefill_ctx if self.prefill_seqs else 0
        dc = max(self.decode_contexts(), default=0) + 1 if self.decode_seqs else 0
        return max(pf, dc)

    def row(self, latency_s: float) -> ProfileRow:
        return ProfileRow(self.kind, self.prefill_tokens, self.prefill_seqs, self.prefill_ctx,
                          self.decode_seqs, self.decode_ctx, latency_s)

    @classmethod
    def prefill(cls, tokens: int, ctx: int = 0, seqs: int = 1) -> Shape:
        return cls(tokens, seqs, ctx, 0, 0)

    @classmethod
    def decode(cls, seqs: int, ctx_per_seq: int) -> Shape:
        return cls(0, 0, 0, seqs, seqs * ctx_per_seq)

    @classmethod
    def mixed(cls, tokens: int, seqs: int, ctx_per_seq: int) -> Shape:
        return cls(tokens, 1, 0, seqs, seqs * ctx_per_seq)


def prefill_sizes(max_tokens: int) -> list[int]:
    """Fresh-prefill forward sizes: dense where throughput still rises, sparser further out.

    Multiples of 32 up to 256, of 64 up to 512, of 128 up to 1024, of 256 up to 2048, of 512 up
    to 4096, of 1024 beyond, plus 16; always ending at ``max_tokens``.
    """
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
    sizes = {16, max_tokens}
    lo = 0
    for hi, step in ((256, 32), (512, 64), (1024, 128), (2048, 256), (4096, 512),
                     (1 << 30, 1024)):
        sizes.update(range(lo + step, min(hi, max_tokens) + 1, step))
        lo = hi
        if hi >= max_tokens:
            break
    return sorted(s for s in sizes if s <= max_tokens)


def cpu_grid(max_tokens: int, max_num_seqs: int = 256, max_decode_ctx: int = 65536) -> list[Shape]:
    """A sweep small enough for a CPU: fresh prefills up to ``max_tokens`` (the pivot curve),
    chunks over prior context, decode batches over context lengths, and a few mixed batches.

    ``max_tokens`` also bounds every sequence's length (use the model's max_model_len);
    ``max_decode_ctx`` bounds the total KV a decode batch reads (memory of the KV cache).
    """
    shapes = [Shape.prefill(s) for s in prefill_sizes(max_tokens)]
    for chunk in (32, 128, 512):
        for ctx in (256, 1024):
            if chunk + ctx <= max_tokens:
                shapes.append(Shape.prefill(chunk, ctx))
    shapes += [Shape.prefill(256, seqs=4), Shape.prefill(min(512, max_tokens), seqs=8)]
    for seqs in (1, 4, 16, 64, 128):
        for ctx in (64, 256, 1024):
            if seqs <= max_num_seqs and ctx < max_tokens and seqs * ctx <= max_decode_ctx:
                shapes.append(Shape.decode(seqs, ctx))
    for chunk, seqs, ctx in ((64, 16, 256), (256, 32, 256), (512, 8, 1024), (128, 64, 128)):
        if chunk <= max_tokens and seqs <= max_num_seqs and ctx < max_tokens:
            shapes.append(Shape.mixed(chunk, seqs, ctx))
    return list(dict.fromkeys(shapes))


def gpu_grid(max_tokens: int = 8192) -> list[Shape]:
    """The cost-model module's standard grid (the paper's sweep range), for GPUs."""
    return [Shape(*g) for g in standard_grid(max_tokens)]


def quick_grid(max_tokens: int) -> list[Shape]:
    """A handful of shapes (tests and smoke runs): enough for a curve and every fitted term."""
    sizes = [s for s in (16, 32, 64, 128, 256, 512) if s <= max_tokens]
    shapes = [Shape.prefill(s) for s in sizes]
    shapes += [Shape.prefill(32, min(128, max_tokens - 32)), Shape.decode(1, 64),
               Shape.decode(4, 64), Shape.decode(16, 64), Shape.mixed(32, 4, 64)]
    return list(dict.fromkeys(shapes))
