"""pytest-cbatch: conformance kit for continuous-batching LLM schedulers."""
