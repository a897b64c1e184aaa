"""The models: the transformer, its MTP drafter, KV cache, weights, tokenizer and recipes (torch)."""
