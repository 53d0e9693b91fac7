"""The embedded tiny policy: a character tokenizer, a Qwen2-style model, its warm start and cache."""
