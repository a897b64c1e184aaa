"""met: an LLM inference toolchain whose speculative decoding is planned from measurement."""

__version__ = "0.1.0"
