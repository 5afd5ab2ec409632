"""A tiny random Llama that speaks through the embedded SmolLM2's tokenizer and chat template:
text prompts, chats and stop strings at CI speed (its answers are random text, the same every
run).  ``save_tiny_chat_model(folder)`` writes it as an HF folder for a server in another
process."""

from __future__ import annotations

from pathlib import Path

from paged_tutorial.config import ModelConfig
from paged_tutorial.loading.models import (Model, find_embedded_smollm2, random_model,
                                           save_hf_folder)
from paged_tutorial.loading.tokenizer import Tokenizer
from paged_tutorial.loading.weights import open_gguf, read_gguf_metadata


def smollm2_tokenizer() -> Tokenizer:
    path = find_embedded_smollm2()
    return Tokenizer.from_gguf_metadata(read_gguf_metadata(open_gguf(Path(path))), str(path))


def tiny_chat_model(tokenizer: Tokenizer, seed: int = 0) -> Model:
    eos = tuple(t for t in (tokenizer.backend.token_to_id("<|im_end|>"),) if t is not None)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_ids=eos)
    model = random_model(config, "float32", seed=seed)
    return Model(model.config, model.weights, tokenizer, "float32", source="tiny-chat")


def save_tiny_chat_model(folder: Path, tokenizer: Tokenizer) -> Path:
    return save_hf_folder(tiny_chat_model(tokenizer), folder)
