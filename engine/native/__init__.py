"""Our own decoder layers for Llama, Mistral, Qwen2 and Qwen3 (spec, RoPE, ops, layers, weights); see load.py."""
