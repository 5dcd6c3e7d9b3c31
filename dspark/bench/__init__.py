"""Benchmarks: commands that measure and write results with provenance (not timed tests)."""
