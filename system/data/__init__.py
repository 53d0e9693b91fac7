"""Prompts and their flow: prompt sources (synthetic arithmetic, GSM8K files), the sampler, the buffer."""
