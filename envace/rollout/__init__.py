"""Batched generation and the episode runner."""
