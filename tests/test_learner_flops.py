"""``system.learner.flops``: the model-FLOPs accounting behind the learner benchmark's MFU.

Checked against torch's own ``FlopCounterMode`` (which counts every matrix product the model runs),
with eager attention: PaLM's ``2 N D + 4 L d S D`` per forward is exact there, and the backward
costs twice the forward.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.flops import matmul_parameters, peak_tflops, step_flops


def _model(tie: bool) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                      attn_implementation="eager")
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("tie", [False, True])
def test_matmul_parameters_by_hand(tie):
    # per layer: q 64x64, k and v 64x32 (2 kv heads of 16), o 64x64 -> 12288; MLP 3 x 64 x 160 = 30720
    # 3 layers: 129024; lm_head 256 x 64 = 16384, once whether tied or not
    assert matmul_parameters(_model(tie)) == 3 * (4096 + 2048 + 2048 + 4096 + 3 * 64 * 160) + 256 * 64


def test_step_flops_by_hand():
    # N 10, L 2, d 3, S 4, D 5: one update 8*10*5 + 16*2*3*4*5 = 400 + 1920; two: 14*50 + 28*120
    assert step_flops(10, 2, 3, 4, 5) == 2320
    assert step_flops(10, 2, 3, 4, 5, updates=2) == 700 + 3360
    with pytest.raises(ValueError, match="non-negative"):
        step_flops(10, 2, 3, 4, -5)


def test_step_flops_equals_torch_flop_counter():
    model, seq_len, batch = _model(tie=False), 24, 2
    ids = torch.randint(0, 256, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as forward:
        model(input_ids=ids)
    with FlopCounterMode(display=False) as train:
        model(input_ids=ids).logits.sum().backward()
    n, tokens = matmul_parameters(model), batch * seq_len
    # a step = one proximal forward + one update (forward + backward)
    assert forward.get_total_flops() + train.get_total_flops() == step_flops(n, 3, 64, seq_len, tokens)


def test_peak_tflops():
    assert peak_tflops(torch.device("cpu")) is None
    assert peak_tflops(torch.device("cpu"), given=100) == 100.0
    with pytest.raises(ValueError, match="positive"):
        peak_tflops(torch.device("cpu"), given=0.0)
