"""Weight export of an unsharded model (no process group): HF names, bf16, ``lm_head.weight`` always.

The sharded 2-rank export runs in ``test_learner_fsdp``.
"""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.export import _with_head, export_weights
from system.weight_payload import decode_weights


def _model(tie):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg)


@pytest.mark.parametrize("tie", [False, True])
def test_export_is_bf16_state_dict_with_head(tie):
    model = _model(tie)
    payload = export_weights(model, policy_version=7)
    exported = dict(decode_weights(payload))
    expected = model.state_dict()
    assert payload.policy_version == 7 and set(exported) == set(expected) and "lm_head.weight" in exported
    for name, weight in expected.items():
        assert exported[name].dtype == torch.bfloat16
        torch.testing.assert_close(exported[name], weight.to(torch.bfloat16), rtol=0, atol=0, msg=name)
    if tie:
        torch.testing.assert_close(exported["lm_head.weight"], exported["model.embed_tokens.weight"])


def test_tied_head_is_filled_in_when_the_state_omits_it():
    model = _model(tie=True)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert _with_head(state, model)["lm_head.weight"] is state["model.embed_tokens.weight"]
    untied = _model(tie=False)
    with pytest.raises(ValueError, match="lm_head.weight"):
        _with_head({k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}, untied)
