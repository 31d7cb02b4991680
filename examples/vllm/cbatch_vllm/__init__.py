"""pytest-cbatch adapter for vLLM V1 scheduler."""
