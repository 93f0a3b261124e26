"""Sampling, verification, decode loops and metrics."""
