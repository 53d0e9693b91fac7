"""What the real-engine tests share (``tests/test_rollout_vllm.py``, ``tests/test_rollout_fp8_engines.py``):
the config, prompts and temperature, and the log-prob reference. Their tiny model and engines are
module-scoped fixtures in ``tests/conftest.py`` (``model_dir``, ``hf_model``, ``bf16_engine``,
``fp8_worker``): each of the two modules builds its own.

Reference log-probs come from transformers in float32 on the *bf16-rounded* weights (the
function vLLM's bf16 engine approximates), with logits divided by the temperature before
``log_softmax``. The remaining bf16 gap comes from vLLM's bf16 activations and logits, so it
grows with the logits' magnitude (one bf16 ulp is 2**-8 relative): the test model is
warm-started for 10 steps only, which keeps its logits under ~2 and the gap near 0.005.
"""

import copy

import numpy as np
import torch

from system.config import RunConfig
from system.config.data import ArithmeticTaskConfig
from system.data.arithmetic import ArithmeticPrompts

CFG = RunConfig.model_validate({
    "model": {"type": "tiny", "warm_start_steps": 10, "warm_start_label_smoothing": 0.0},
    "data": {"task": {"type": "arithmetic", "num_prompts": 500}},
    # vLLM's own FP8 kernel in the worker: the reference the row-wise and upcast engines are compared with
    # (``auto`` may pick either of those on this CPU)
    "rollout": {"group_size": 4, "max_new_tokens": 5, "engine": {"type": "vllm", "kv_cache_gib": 0.25},
                "fp8_kernel": "vllm"},
})
TEMPERATURE = 0.7
PROMPTS = [ArithmeticPrompts(ArithmeticTaskConfig(num_prompts=500), seed=0)[i] for i in range(8)]


def reference_logprobs(model, prompt_ids, response_ids, temperature):
    """log softmax(logits / T) of each response token, by transformers in float32."""
    ids = torch.tensor(np.concatenate([prompt_ids, response_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1] / temperature
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt_ids):, None]).squeeze(-1).numpy()


def logprob_gaps(model, samples, temperature):
    """|vLLM - transformers on the bf16-rounded weights| over every sampled token."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    gaps = [np.abs(r.behaviour_logprobs - reference_logprobs(rounded, s.prompt_token_ids, r.response_token_ids, temperature))
            for s in samples for r in s.responses]
    return np.concatenate(gaps)


def sample(engine, temperature=TEMPERATURE, seed=1):
    return engine.generate([p.text for p in PROMPTS], n=4, temperature=temperature, top_p=1.0,
                           max_new_tokens=5, seed=seed)
