"""The speculative-decoding policy: pure host code, no torch, no I/O, no clock."""
