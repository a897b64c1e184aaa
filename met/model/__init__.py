"""The models: transformer, MTP and DFlash drafters, KV cache, weights, tokenizers, recipes, HF folders (torch)."""
