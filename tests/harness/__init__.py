"""The adapter driving and observing vLLM."""
