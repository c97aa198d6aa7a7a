"""Bidirectional text encoders (BERT)."""
