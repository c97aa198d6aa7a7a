"""Decoder-only language models (GPT-2, Llama 3) and the pieces every decoder shares (``decoder``:
config, attention with a static KV cache, analytic FLOPs and memory, greedy generation)."""
