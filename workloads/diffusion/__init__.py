"""Diffusion workloads."""
