"""A tiny random-weight model directory for running vLLM on CPU without downloads.

vLLM only needs a Hugging Face ``config.json`` to build the model; with ``load_format="dummy"``
the weights are random. Timing depends on shape, not on weights, which is all the scheduler tests
need. The directory also holds a tokenizer (``tiny_tokenizer``: GPT-2's BPE cut to the model's
vocabulary, with a chat template), so a server of this model answers text prompts and chat
completions as well as token ids; engines fed token ids only may still skip loading it
(``skip_tokenizer_init=True``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import PositiveInt, model_validator

from accelgen.core.specs import StrictModel
from accelgen.vllm_integration.tiny_tokenizer import MIN_VOCAB_SIZE, eos_token_id, tokenizer_files

# vLLM's CPU attention kernels support these head sizes only (cpu_attn.py, 0.32.0).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class TinyModelSpec(StrictModel):
    """Shape of the random model (Llama architecture: RMSNorm, rotary, SwiGLU)."""

    num_layers: PositiveInt = 2
    hidden_size: PositiveInt = 64
    num_heads: PositiveInt = 1
    num_kv_heads: PositiveInt = 1
    ffn_size: PositiveInt = 128
    vocab_size: PositiveInt = 1024  # ids of the tokenizer too (tiny_tokenizer)
    max_position_embeddings: PositiveInt = 8192
    dtype: str = "float32"  # the CPU backend's fastest path for a model this small

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @model_validator(mode="after")
    def _shape(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                             f"{self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size {self.vocab_size} is below the tokenizer's "
                             f"{MIN_VOCAB_SIZE} (GPT-2's 256 byte tokens and <|endoftext|>)")
        if self.head_dim not in CPU_HEAD_SIZES:
            raise ValueError(f"head size {self.head_dim} is not supported by vLLM's CPU "
                             f"attention (supported: {CPU_HEAD_SIZES})")
        return self

    def hf_config(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "torch_dtype": self.dtype,
            "tie_word_embeddings": False,
            "bos_token_id": eos_token_id(self.vocab_size),
            "eos_token_id": eos_token_id(self.vocab_size),
        }


def write_tiny_model(path: Path | str, spec: TinyModelSpec | None = None) -> Path:
    """Write ``config.json``, a ``generation_config.json`` with no sampling defaults and the
    tokenizer's files into ``path``; a file is rewritten only when its content changes, and then
    atomically (a temporary file renamed over it), so engines can share one directory."""
    spec = spec or TinyModelSpec()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    eos = eos_token_id(spec.vocab_size)
    files = {name: json.dumps(content, indent=2, sort_keys=True) + "\n" for name, content in {
        "config.json": spec.hf_config(),
        # Present so that vLLM does not go looking for generation defaults elsewhere.
        "generation_config.json": {"bos_token_id": eos, "eos_token_id": eos},
    }.items()}
    files.update(tokenizer_files(spec.vocab_size, spec.max_position_embeddings))
    for name, text in files.items():
        f = out / name
        if not f.exists() or f.read_text(encoding="utf-8") != text:
            tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, f)
    return out
