"""A random-initialised decoder of a model's real shape, with a KV cache, for timing.

Timing depends on shapes, not on weights, so no checkpoint is needed. The module follows the two
families in ``accelgen.costmodel.datasheets.MODELS``:

- OPT-style (``gated_ffn=False``): learned positions, LayerNorm, ReLU FFN of two matrices;
- Llama-style (``gated_ffn=True``): rotary positions, RMSNorm, SwiGLU FFN of three matrices,
  grouped-query attention when ``num_kv_heads < num_heads``.

One iteration is a flat token batch (as in vLLM): the linear layers run on all tokens at once;
the LM head and greedy sampling run on each sequence's last token only. Attention, two ways:

- ``flash`` (GPU, with the ``flash-attn`` package): every sequence's cached context and new
  tokens are packed back to back in one KV tensor per layer; the step writes its new keys and
  values into their slots and one ``flash_attn_varlen_func`` call per layer attends every query
  of the ragged batch (prefill chunks and decodes alike) with ``cu_seqlens`` offsets and the
  causal mask aligned to the end of each sequence, as vLLM's FlashAttention backend does;
- ``sdpa`` (the fallback: CPU, or flash-attn absent): ``torch.nn.functional.
  scaled_dot_product_attention`` per group of equally shaped sequences (prefill chunks over their
  prior context, decodes over theirs) against a preallocated KV cache per group.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from accelgen.core.specs import ModelProfile
from accelgen.profiling.grid import Shape

# Above this many bytes of KV cache for one iteration, all layers share one cache tensor (each
# layer's slice is then far larger than any CPU cache, so reading it still streams from memory).
DEFAULT_KV_BUDGET_BYTES = 2 << 30


@dataclass(slots=True)
class AttnGroup:
    """``seqs`` sequences with ``new`` new tokens each over ``ctx`` cached tokens."""

    seqs: int
    new: int
    ctx: int
    offset: int  # first row of the group in the flat token batch
    mask: torch.Tensor | None = None  # boolean [new, ctx + new], None when causal or one token
    k_cache: list[torch.Tensor] = field(default_factory=list)  # per layer [seqs, kvh, ctx+new, d]
    v_cache: list[torch.Tensor] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.seqs * self.new


@dataclass(slots=True)
class PackedKV:
    """The ``flash`` layout: sequence i's cached context and new tokens occupy rows
    ``cu_k[i]:cu_k[i+1]`` of one [total tokens, kv heads, head dim] tensor per layer, its new
    tokens the last ``cu_q[i+1] - cu_q[i]`` of them (rows ``new_slots`` in batch order)."""

    cu_q: torch.Tensor  # int32 [seqs + 1]
    cu_k: torch.Tensor  # int32 [seqs + 1]
    max_q: int
    max_k: int
    new_slots: torch.Tensor  # int64 [N]: the cache row each new token's key/value goes to
    k_cache: list[torch.Tensor] = field(default_factory=list)  # per layer [total, kvh, d]
    v_cache: list[torch.Tensor] = field(default_factory=list)


@dataclass(slots=True)
class Batch:
    """Inputs of one iteration, built outside the timed region."""

    shape: Shape
    token_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    groups: list[AttnGroup]
    last_index: torch.Tensor  # [num sequences] row of each sequence's last token
    shared_cache: bool
    packed: PackedKV | None = None  # set for the flash path (groups then hold no caches)


# flash_attn.flash_attn_varlen_func's signature (the arguments this module passes).
VarlenAttention = Callable[..., torch.Tensor]


class DecoderLayer(nn.Module):
    def __init__(self, m: ModelProfile, varlen: VarlenAttention | None = None) -> None:
        super().__init__()
        self.varlen = varlen
        h, hd = m.hidden_size, m.head_dim
        self.heads, self.kv_heads, self.head_dim = m.num_heads, m.num_kv_heads, hd
        self.gated = m.gated_ffn
        norm: type[nn.Module] = nn.RMSNorm if m.gated_ffn else nn.LayerNorm
        self.norm1, self.norm2 = norm(h), norm(h)
        self.qkv = nn.Linear(h, (m.num_heads + 2 * m.num_kv_heads) * hd, bias=not m.gated_ffn)
        self.out = nn.Linear(m.num_heads * hd, h, bias=not m.gated_ffn)
        self.up = nn.Linear(h, (2 if m.gated_ffn else 1) * m.ffn_size, bias=not m.gated_ffn)
        self.down = nn.Linear(m.ffn_size, h, bias=not m.gated_ffn)

    def forward(self, x: torch.Tensor, batch: Batch, layer: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        qkv = self.qkv(self.norm1(x))
        hq, hk, d = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        q, k, v = qkv.split([hq, hk, hk], dim=-1)
        if rope is not None:
            q, k = _rotate(q, rope, self.heads, d), _rotate(k, rope, self.kv_heads, d)
        if batch.packed is not None:
            x = x + self.out(self._varlen(q, k, v, batch.packed, layer).reshape(-1, hq))
        else:
            x = x + self.out(self._grouped(q, k, v, batch, layer))
        y = self.up(self.norm2(x))
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.relu(y)
        return x + self.down(y)

    def _varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: PackedKV,
                layer: int) -> torch.Tensor:
        """One varlen kernel over the packed batch (the new keys/values written first)."""
        assert self.varlen is not None
        d = self.head_dim
        kc, vc = p.k_cache[layer], p.v_cache[layer]
        kc.index_copy_(0, p.new_slots, k.reshape(-1, self.kv_heads, d))
        vc.index_copy_(0, p.new_slots, v.reshape(-1, self.kv_heads, d))
        return self.varlen(q.reshape(-1, self.heads, d), kc, vc, p.cu_q, p.cu_k, p.max_q,
                           p.max_k, causal=True)

    def _grouped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch,
                 layer: int) -> torch.Tensor:
        """SDPA per group of equally shaped sequences, each against its own cache."""
        hq, d = self.heads * self.head_dim, self.head_dim
        outs = []
        for g in batch.groups:
            rows = slice(g.offset, g.offset + g.tokens)
            qg = q[rows].view(g.seqs, g.new, self.heads, d).transpose(1, 2)
            kc, vc = g.k_cache[layer], g.v_cache[layer]
            kc[:, :, g.ctx:g.ctx + g.new] = k[rows].view(g.seqs, g.new, self.kv_heads, d
                                                         ).transpose(1, 2)
            vc[:, :, g.ctx:g.ctx + g.new] = v[rows].view(g.seqs, g.new, self.kv_heads, d
                                                         ).transpose(1, 2)
            length = g.ctx + g.new
            o = F.scaled_dot_product_attention(
                qg, kc[:, :, :length], vc[:, :, :length], attn_mask=g.mask,
                is_causal=g.mask is None and g.new > 1 and g.ctx == 0,
                enable_gqa=self.kv_heads != self.heads)
            outs.append(o.transpose(1, 2).reshape(g.tokens, hq))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], heads: int,
            d: int) -> torch.Tensor:
    cos, sin = rope  # [N, d/2]
    x = x.view(-1, heads, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).view(-1, heads * d)


class RandomDecoder(nn.Module):
    """Decoder-only transformer of ``model``'s shape with random weights."""

    inv_freq: torch.Tensor  # a buffer (register_buffer), which nn.Module's typing cannot see

    def __init__(self, model: ModelProfile, num_layers: int | None = None,
                 varlen: VarlenAttention | None = None) -> None:
        super().__init__()
        self.profile = model
        self.varlen = varlen  # None: SDPA per group; else the packed varlen path
        h = model.hidden_size
        self.embed = nn.Embedding(model.vocab_size, h)
        self.pos = None if model.gated_ffn else nn.Embedding(model.max_model_len + 2, h)
        layers = model.num_layers if num_layers is None else num_layers
        self.layers = nn.ModuleList(DecoderLayer(model, varlen) for _ in range(layers))
        self.norm: nn.Module = nn.RMSNorm(h) if model.gated_ffn else nn.LayerNorm(h)
        d = model.head_dim
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """One iteration; returns the greedily sampled next token of every sequence."""
        x = self.embed(batch.token_ids)
        rope = None
        if self.pos is not None:
            x = x + self.pos(batch.positions + 2)  # OPT offsets learned positions by 2
        else:
            ang = batch.positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]
            rope = (ang.cos().to(x.dtype), ang.sin().to(x.dtype))
        for i, layer in enumerate(self.layers):
            idx = 0 if batch.shared_cache else i
            x = layer(x, batch, idx, rope)
        last = self.norm(x.index_select(0, batch.last_index))
        logits = last @ self.embed.weight.t()  # tied LM head, last token of each sequence only
        return logits.argmax(dim=-1)


def build_model(model: ModelProfile, device: str = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0, num_layers: int | None = None,
                varlen: VarlenAttention | None = None) -> RandomDecoder:
    """The random decoder; ``varlen`` (e.g. ``flash_attn.flash_attn_varlen_func``) selects the
    packed varlen attention path, None the SDPA path."""
    torch.manual_seed(seed)
    with torch.device(device):
        net = RandomDecoder(model, num_layers=num_layers, varlen=varlen)
    # Small weights keep activations finite through many layers (no NaN/denormal slow paths).
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return net.to(dtype=dtype).eval()


def make_batch(net: RandomDecoder, shape: Shape,
               kv_budget_bytes: int = DEFAULT_KV_BUDGET_BYTES) -> Batch:
    """Inputs and a filled KV cache for one iteration of ``shape`` (allocation is not timed)."""
    m = net.profile
    if shape.max_len() > m.max_model_len:
        raise ValueError(f"{shape} needs {shape.max_len()} positions; {m.name} has "
                         f"{m.max_model_len}")
    p0 = next(net.parameters())
    device, dtype = p0.device, p0.dtype
    groups: list[AttnGroup] = []
    positions: list[torch.Tensor] = []
    offset = 0
    # Prefill chunks: sizes differ by at most one, so at most two groups.
    chunks = shape.chunks()
    for size in sorted(set(chunks), reverse=True):
        n = chunks.count(size)
        groups.append(AttnGroup(n, size, shape.prefill_ctx, offset))
        positions += [torch.arange(shape.prefill_ctx, shape.prefill_ctx + size)] * n
        offset += n * size
    ctxs = shape.decode_contexts()
    for ctx in sorted(set(ctxs), reverse=True):
        n = ctxs.count(ctx)
        groups.append(AttnGroup(n, 1, ctx, offset))
        positions += [torch.full((1,), ctx)] * n
        offset += n
    layers = len(net.layers)
    kvh, d = m.num_kv_heads, m.head_dim
    per_layer = sum(2 * g.seqs * kvh * (g.ctx + g.new) * d for g in groups) * dtype.itemsize
    shared = layers > 1 and per_layer * layers > kv_budget_bytes
    last, end = [], 0
    for g in groups:
        for _ in range(g.seqs):
            end += g.new
            last.append(end - 1)
    gen = torch.Generator().manual_seed(shape.forward_size)
    ids = torch.randint(0, m.vocab_size, (offset,), generator=gen)
    batch = Batch(shape, ids.to(device), torch.cat(positions).to(device), groups,
                  torch.tensor(last, device=device), shared)
    if net.varlen is not None:
        batch.packed = _packed_kv(groups, max(layers, 1), 1 if shared else max(layers, 1),
                                  kvh, d, device, dtype)
        return batch
    for g in groups:
        if g.new > 1 and g.ctx > 0:
            i = torch.arange(g.new)[:, None]
            j = torch.arange(g.ctx + g.new)[None, :]
            g.mask = (j <= g.ctx + i).to(device)
        for _ in range(1 if shared else max(layers, 1)):
            for cache in (g.k_cache, g.v_cache):
                # Filled, not zeros: untouched zero pages would read from a shared page.
                cache.append(torch.full((g.seqs, kvh, g.ctx + g.new, d), 0.01, device=device,
                                        dtype=dtype))
    return batch


def _packed_kv(groups: list[AttnGroup], layers: int, caches: int, kvh: int, d: int,
               device: torch.device, dtype: torch.dtype) -> PackedKV:
    """Offsets and filled KV tensors of the flash layout, sequences in batch order."""
    new, total = [], []
    for g in groups:
        new += [g.new] * g.seqs
        total += [g.ctx + g.new] * g.seqs
    cu_q = torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(total)], dtype=torch.int32)
    slots = torch.cat([torch.arange(int(cu_k[i + 1]) - n, int(cu_k[i + 1]))
                       for i, n in enumerate(new)])
    p = PackedKV(cu_q.to(device), cu_k.to(device), max(new), max(total), slots.to(device))
    rows = int(cu_k[-1])
    for _ in range(caches):
        for cache in (p.k_cache, p.v_cache):
            cache.append(torch.full((rows, kvh, d), 0.01, device=device, dtype=dtype))
    if caches < layers:  # one tensor shared by every layer (see DEFAULT_KV_BUDGET_BYTES)
        p.k_cache *= layers
        p.v_cache *= layers
    return p


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                     causal: bool = False) -> torch.Tensor:
    """``flash_attn_varlen_func``'s semantics in plain torch (for tests on CPU): per sequence,
    softmax(q k^T / sqrt(d)) v with the causal mask aligned to the bottom right (query j of n sees
    keys up to ``len_k - n + j``), grouped-query heads repeated."""
    del max_seqlen_q, max_seqlen_k
    out = torch.empty_like(q)
    rep = q.shape[1] // k.shape[1]
    for i in range(len(cu_seqlens_q) - 1):
        qs = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]))
        ks = slice(int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1]))
        qi = q[qs].transpose(0, 1)
        ki = k[ks].repeat_interleave(rep, dim=1).transpose(0, 1)
        vi = v[ks].repeat_interleave(rep, dim=1).transpose(0, 1)
        n, length = qi.shape[1], ki.shape[1]
        mask = None
        if causal:
            mask = (torch.arange(length)[None, :] <= (length - n) + torch.arange(n)[:, None])
        out[qs] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask.to(q.device)
                                                 if mask is not None else None).transpose(0, 1)
    return out


def kv_bytes(net: RandomDecoder, shape: Shape) -> int:
    """KV bytes one iteration of ``shape`` holds (all layers), before any sharing."""
    m, dtype = net.profile, next(net.parameters()).dtype
    tokens = sum((s + shape.prefill_ctx) for s in shape.chunks()) + \
        sum(c + 1 for c in shape.decode_contexts())
    return tokens * 2 * len(net.layers) * m.num_kv_heads * m.head_dim * dtype.itemsize


def flops(model: ModelProfile, shape: Shape) -> float:
    """Dense FLOPs of one iteration (linear layers, attention pairs and the LM head)."""
    dense = 2.0 * model.num_layers * model.params_per_layer * shape.forward_size
    pairs = sum(n * (shape.prefill_ctx + (n + 1) / 2) for n in shape.chunks()) + \
        shape.decode_ctx + shape.decode_seqs
    attn = 4.0 * model.num_layers * model.num_heads * model.head_dim * pairs
    head = 2.0 * model.vocab_size * model.hidden_size * (shape.prefill_seqs + shape.decode_seqs)
    return dense + attn + head if math.isfinite(dense) else math.nan
