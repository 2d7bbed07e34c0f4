"""Tasks, demonstrations, splits, dataset files and tokenizer training."""
