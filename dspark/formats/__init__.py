"""Checkpoint formats: speculators (native), GGUF (llama.cpp ``draft-dspark``) and importers."""
