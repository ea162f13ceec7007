"""The tiny model's tokenizer: GPT-2's byte-level BPE cut to the model's vocabulary, in the
Hugging Face files vLLM loads (``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` with a
chat template), written offline from the GPT-2 files the package already ships
(``accelgen.workloads.tokenizer``, checked by sha256).

A vocabulary of ``V`` ids keeps GPT-2's first ``V - 1`` ids unchanged (its 256 byte tokens, then
its first ``V - 257`` merges in GPT-2's order) and puts ``<|endoftext|>`` (BOS and EOS) at id
``V - 1``. A prefix of the merge list is itself a complete byte-level BPE: every text encodes
(bytes no merge covers stay single-byte tokens) and decodes back exactly; a word GPT-2 writes
with a later merge takes a few more tokens. ``V = 50257`` is GPT-2 itself. The tiny model keeps
1024 ids because the logits and the sampler over GPT-2's 50257 ids would cost each decode step
more than the rest of this model does. The common words of ``workloads.prompts.WORDS`` are single
tokens under the 1024-id cut as under GPT-2.
"""

from __future__ import annotations

import json
from typing import Any

from accelgen.workloads.tokenizer import ENDOFTEXT, _gpt2_files

GPT2_BYTE_TOKENS = 256
GPT2_VOCAB_SIZE = 50257  # 256 bytes + 50000 merges + <|endoftext|>
MIN_VOCAB_SIZE = GPT2_BYTE_TOKENS + 1  # every byte, and the end-of-text token

# The roles as plain text, one message a line, then the assistant's turn: the tiny vocabulary
# has no room for chat special tokens, and a template of ordinary text reads the same to any
# client. Content given as OpenAI content parts reaches it as one string (vLLM flattens them for
# a template that uses message['content'] as a string).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- message['role'] + ': ' + message['content'] + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant:' -}}{%- endif -%}"
)


def eos_token_id(vocab_size: int) -> int:
    """The id of ``<|endoftext|>`` in a cut of ``vocab_size`` ids."""
    return min(vocab_size, GPT2_VOCAB_SIZE) - 1


def tokenizer_files(vocab_size: int, model_max_length: int) -> dict[str, str]:
    """File name -> content of the tokenizer with ``vocab_size`` ids."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} cannot hold GPT-2's {GPT2_BYTE_TOKENS} byte "
                         f"tokens and <|endoftext|> (at least {MIN_VOCAB_SIZE})")
    vocab_bpe, encoder_json = _gpt2_files()
    eos = eos_token_id(vocab_size)
    encoder: dict[str, int] = json.loads(encoder_json)
    vocab = {token: i for token, i in encoder.items() if i < eos and token != ENDOFTEXT}
    vocab[ENDOFTEXT] = eos
    # vocab.bpe: a "#version" line, one merge a line in rank order, a trailing newline.
    lines = vocab_bpe.decode("utf-8").split("\n")
    merges = lines[1:1 + eos - GPT2_BYTE_TOKENS]
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT,
        "add_bos_token": False, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    return {
        "vocab.json": json.dumps(dict(sorted(vocab.items(), key=lambda kv: kv[1])),
                                 ensure_ascii=False) + "\n",
        "merges.txt": "\n".join([lines[0], *merges]) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps(
            {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT},
            indent=2, sort_keys=True) + "\n",
    }
