"""Tokens to packed batches: the multi-item layout, batching by token budget, the planner, pair measuring."""
