"""Serving: an OpenAI-compatible HTTP server with DSpark speculative decoding, and the
hand-off of a checkpoint to vLLM."""
