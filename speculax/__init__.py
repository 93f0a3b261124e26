"""speculax: speculative decoding research in JAX (public API; see README)."""
