"""The rollout core: quantization choice, the vLLM engine (the only vLLM import) and the worker core."""
