"""`met serve`: boot-time key checks, the OpenAI-compatible HTTP API, metrics and the TUI."""
