"""Synthetic prompt content for replaying a length-only trace on a real engine or server.

A trace carries prompt *lengths*; an engine needs content. With random weights (or any model, for
timing) the content does not matter, only that it is deterministic per request and that two
requests share no prefix.
"""

from __future__ import annotations

import numpy as np

# Ids 0-2 are usually special (padding, BOS, EOS).
FIRST_ID = 3
# Short common English words, one token each in the GPT-2, Llama and OPT vocabularies (with the
# leading space), so that n of them make about n prompt tokens without a tokenizer.
WORDS = (" the", " of", " and", " to", " in", " is", " it", " that", " for", " on", " was",
         " with", " he", " as", " at", " by", " this", " had", " not", " are", " but", " from",
         " or", " have", " an", " they", " which", " one", " you", " were")


def prompt_token_ids(req_id: int, n: int, vocab_size: int) -> list[int]:
    """``n`` token ids in ``[3, vocab_size)``, drawn with ``req_id`` as the seed."""
    rng = np.random.default_rng(req_id)
    return rng.integers(FIRST_ID, max(vocab_size, FIRST_ID + 1), size=n).tolist()


def prompt_text(req_id: int, n: int) -> str:
    """About ``n`` tokens of text (``n`` common one-token words, drawn with ``req_id`` as the
    seed); the server's own count may differ by a few tokens (BOS, merges)."""
    rng = np.random.default_rng(req_id)
    return "".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=n)).lstrip()
