"""Tiny llama config.json: enough for vLLM ModelConfig, no weights."""
