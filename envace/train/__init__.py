"""Training: the warmup SFT LightningModule and (later) role-wise GRPO."""
