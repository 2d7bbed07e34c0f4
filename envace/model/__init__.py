"""Models: the embedded default built from params, or any local Hugging Face checkpoint.

Nothing is downloaded: `HF_HUB_OFFLINE=1` and `local_files_only=True`. Every model is
saved with `save_pretrained` (safetensors) next to its tokenizer, so any HF tool loads it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from envace.config import ModelConfig


def build_default(cfg: ModelConfig, tokenizer):
    """A small Llama-style causal LM sized by `cfg`, vocabulary from `tokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    torch.nn.init.normal_(model.get_input_embeddings().weight, 0.0, cfg.embedding_std)
    return model


def load(path: str | Path, dtype: torch.dtype | None = None):
    """(model, tokenizer) from a local checkpoint directory holding both."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    return model, tokenizer


def policy_for(cfg: ModelConfig, tokenizer_dir: str | Path):
    """(model, tokenizer) to start training from: the embedded default or `cfg.source`."""
    if cfg.source == "embedded":
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        return build_default(cfg, tokenizer), tokenizer
    return load(cfg.source)


def save(model, tokenizer, path: str | Path) -> Path:
    """Atomically save model (safetensors) and tokenizer into one directory."""
    from envace.io import atomic_dir

    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return Path(path)
