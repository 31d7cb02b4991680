"""pytest-cbatch adapter for Hugging Face transformers' continuous batching (FIFO and prefill-first schedulers)."""
