"""Mixture-of-experts workloads."""
