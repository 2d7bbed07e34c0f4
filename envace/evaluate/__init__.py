"""Evaluation against the real environment: rehearsal accuracy and real-task success."""
