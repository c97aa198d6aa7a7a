"""Stateless analyses over the results tables (DataFrames in, DataFrames out; no I/O, no plotting)."""
