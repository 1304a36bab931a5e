"""Benchmarks: each script runs as `.venv/bin/python bench/X.py` and ends with one JSON line."""
