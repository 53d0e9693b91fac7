"""The user's rollout precision maps to the scheme each platform supports (STACK.md)."""

import pytest

from system.rollout.quantization import resolve_quantization, scheme_name


@pytest.mark.parametrize(
    ("requested", "device", "scheme"),
    [("fp8", "cpu", "fp8_per_channel"), ("fp8", "cuda", "fp8"), ("bf16", "cpu", None), ("bf16", "cuda", None)],
)
def test_mapping(requested, device, scheme):
    assert resolve_quantization(requested, device) == scheme


def test_unknown_precision_or_device_is_refused():
    with pytest.raises(ValueError, match="rollout.quantization='int4'"):
        resolve_quantization("int4", "cpu")
    with pytest.raises(ValueError, match="device 'tpu'"):
        resolve_quantization("fp8", "tpu")


def test_scheme_names():
    assert scheme_name(None) == "bf16"
    assert scheme_name("fp8_per_channel") == "fp8_per_channel"
