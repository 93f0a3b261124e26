"""Llama-family model, KV cache, checkpoint loaders and tokenizer."""
