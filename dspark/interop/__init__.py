"""Interop checks: peer tools (speculators, llama.cpp, vLLM) read our drafters as we mean them.

Each check (`dspark check speculators|llama-cpp|vllm`) builds the peer in its own environment
outside the repo (under ``$DSPARK_CACHE``), runs it on our exports and writes JSON (and a
markdown table) under docs/results/. None is part of the test suite.
"""
