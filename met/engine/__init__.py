"""The engine: the model runner (prefill, draft, verify, accept) and the scheduler."""
