"""The tiny model's tokenizer: GPT-2's BPE cut to the model's vocabulary, loaded the way vLLM
loads it (``transformers.AutoTokenizer`` from the model directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelgen.vllm_integration.tiny_model import TinyModelSpec, write_tiny_model
from accelgen.vllm_integration.tiny_tokenizer import tokenizer_files
from accelgen.workloads.prompts import WORDS, prompt_text
from accelgen.workloads.tokenizer import GPT2Tokenizer

TEXTS = ("Hello, how are you? The quick brown fox jumps over the lazy dog.",
         "ünïcödé 日本語 🙂 tabs\tand\nnewlines  double  spaces", "")


def test_the_tiny_model_directory_loads_as_a_hugging_face_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    spec = TinyModelSpec()
    model = write_tiny_model(tmp_path / "m", spec)
    tok = transformers.AutoTokenizer.from_pretrained(str(model))
    cfg = json.loads((model / "config.json").read_text())
    assert len(tok) == spec.vocab_size == cfg["vocab_size"]
    assert tok.eos_token_id == tok.bos_token_id == cfg["eos_token_id"] == spec.vocab_size - 1
    gpt2 = GPT2Tokenizer()
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text  # byte-level: every text round-trips
        assert all(0 <= i < spec.vocab_size - 1 for i in ids)
    # GPT-2's own ids wherever GPT-2 uses only the first merges (the prompt words).
    for word in WORDS:
        assert tok.encode(word, add_special_tokens=False) == gpt2.encode(word)
    text = " " + prompt_text(7, 50)  # (the text's first word has no space before it)
    assert tok.encode(text, add_special_tokens=False) == gpt2.encode(text)
    assert len(gpt2.encode(text)) == 50
    chat = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert chat == "system: Be brief.\nuser: Hi\nassistant:"


def test_the_cut_is_a_prefix_of_gpt2() -> None:
    full = tokenizer_files(50257, 1024)
    vocab = json.loads(full["vocab.json"])
    assert len(vocab) == 50257 and vocab["<|endoftext|>"] == 50256
    assert len(full["merges.txt"].splitlines()) == 1 + 50000  # "#version" + every merge
    cut = tokenizer_files(300, 1024)
    small = json.loads(cut["vocab.json"])
    assert small == {**{k: v for k, v in vocab.items() if v < 299}, "<|endoftext|>": 299}
    assert cut["merges.txt"].splitlines() == full["merges.txt"].splitlines()[:1 + 43]
    with pytest.raises(ValueError, match="vocab_size 256"):
        TinyModelSpec(vocab_size=256)


def test_the_tiny_models_output_re_tokenizes_to_its_count(tmp_path: Path) -> None:
    """``tiny_output.WholeWordOutput`` (what ``accelgen serve`` gives the tiny model): the ids it
    leaves are whole words, any sequence of them decodes to text that the tokenizer gives back
    as the same ids, and EOS and the byte tokens are masked."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    import numpy as np

    from accelgen.vllm_integration.tiny_output import WholeWordOutput, whole_word_ids

    spec = TinyModelSpec()
    model = write_tiny_model(tmp_path / "m", spec)
    tok = transformers.AutoTokenizer.from_pretrained(str(model))
    allowed = whole_word_ids(tok, spec.vocab_size)
    assert len(allowed) == 340 and tok.eos_token_id not in allowed
    assert not set(allowed) & set(range(256))  # no byte token (half a UTF-8 character)
    rng = np.random.default_rng(0)
    for _ in range(100):  # 100 replies of 32 tokens
        ids = rng.choice(allowed, 32).tolist()
        text = tok.decode(ids)
        assert "\ufffd" not in text and tok.encode(text, add_special_tokens=False) == ids
    config = SimpleNamespace(model_config=SimpleNamespace(
        tokenizer=str(model), get_vocab_size=lambda: spec.vocab_size))
    proc = WholeWordOutput(config, torch.device("cpu"), False)  # type: ignore[arg-type]
    logits = torch.randn(3, spec.vocab_size)
    logits[:, tok.eos_token_id] = 100.0  # EOS the likeliest: still never chosen
    out = proc.apply(logits.clone())
    assert torch.isfinite(out).sum(dim=1).tolist() == [len(allowed)] * 3
    assert set(out.argmax(dim=1).tolist()) <= set(allowed)
    assert not proc.is_argmax_invariant()
