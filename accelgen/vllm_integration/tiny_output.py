"""What the tiny random-weight model may say: whole words only (a vLLM logits processor).

The tiny model's weights are random, so every id of its vocabulary is about as likely as any
other at each step. Many of those ids are not text a client can count: GPT-2's 256 byte tokens
include the 128 bytes that are only parts of a UTF-8 character (alone they decode to U+FFFD), and
two ids that follow each other may re-tokenize as one merged id or as three. A client that counts
tokens by re-tokenizing the reply (AIPerf by default) then counts a fifth more tokens than the
server made, and the model ends replies at EOS at random (about one step in a thousand).

``WholeWordOutput`` (``--logits-processors
accelgen.vllm_integration.tiny_output:WholeWordOutput``, which ``accelgen serve`` sets for the
tiny model) lets the model choose only among the ids that are one space and ASCII letters (`` the``,
`` of``, `` T``, ...) and that the tokenizer gives back as themselves (340 of the 1024 ids). Any
sequence of them reads as words separated by single spaces, and the tokenizer's pre-tokenizer splits
that text at every space, so re-tokenizing a reply gives back exactly its ids. EOS is not among
them: the model never ends a reply by itself; a request ends at its ``max_tokens``, a stop string,
or the model's length limit (``ignore_eos`` changes nothing). Prompts are untouched.

The mask is applied to every request's logits in the sampler (one ``index_fill_`` over the batch
per step: about as much as one of vLLM's built-in processors). It decides greedy sampling too, so
it is not argmax-invariant.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

if TYPE_CHECKING:
    from vllm.config import VllmConfig

WORD = re.compile(r" [A-Za-z]+")


def whole_word_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """The ids below ``vocab_size`` that decode to one space and ASCII letters and encode back
    to themselves alone."""
    out = []
    for i in range(vocab_size):
        text = tokenizer.decode([i])
        if WORD.fullmatch(text) and tokenizer.encode(text, add_special_tokens=False) == [i]:
            out.append(i)
    return out


class WholeWordOutput(LogitsProcessor):
    """Every id but ``whole_word_ids`` gets logit -inf (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device,
                 is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        model_config = vllm_config.model_config
        vocab_size = int(model_config.get_vocab_size())
        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        allowed = whole_word_ids(tokenizer, vocab_size)
        if not allowed:
            raise ValueError(f"{type(self).__name__}: no id of {model_config.tokenizer}'s "
                             "vocabulary is a whole word (' ' + letters)")
        banned = sorted(set(range(vocab_size)) - set(allowed))
        self.banned = torch.tensor(banned, dtype=torch.long, device=device)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        return None  # the same mask for every request

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.banned.numel() and logits.shape[0]:
            logits.index_fill_(1, self.banned, float("-inf"))
        return logits
