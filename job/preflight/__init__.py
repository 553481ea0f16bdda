"""Preflight, every check before any model is loaded: the destination and every path a run writes (RunPaths,
OUTPUT.lock), the output contract's columns and types, and the checks that tie them to the input."""
