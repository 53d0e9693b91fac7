"""vLLM's side of a completion without an engine: a response's conversion (empty, no log-probs),
vLLM's own top-k / top-p function against the learner's kept set (``system.learner.logprobs``), and
the heap left out of the engine build's garbage collections."""

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from system.rollout.gc_heap import frozen_heap
from system.rollout.vllm_engine import _response

pytestmark = pytest.mark.vllm


def test_empty_responses_and_non_finite_logprobs_are_kept():
    eos_only = SimpleNamespace(token_ids=[1], logprobs=[{1: SimpleNamespace(logprob=float("-inf"))}],
                               text="", finish_reason="stop")
    r = _response(eos_only)
    assert r.text == "" and r.response_token_ids.tolist() == [1] and np.isneginf(r.behaviour_logprobs[0])
    missing = _response(SimpleNamespace(token_ids=[4, 5], logprobs=None, text="12", finish_reason=None))
    assert np.isnan(missing.behaviour_logprobs).all() and missing.finish_reason == "length"


def test_kept_sets_match_vllms_own_top_k_top_p_function():
    """The learner's kept set and renormalised log-probs against vLLM's CPU sampler function
    (``apply_top_k_top_p_pytorch``, then log_softmax as for ``processed_logprobs``) on tie-free
    logits, and on tied ones for top-k alone (deterministic there: every tie is kept)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from system.learner import logprobs

    gen = torch.Generator().manual_seed(0)
    N, V = 64, 1000
    cases = [(2.0 * torch.randn(N, V, generator=gen), 0.9, 0), (3.0 * torch.randn(N, V, generator=gen), 0.5, 0),
             (torch.randn(N, V, generator=gen), 0.95, 50), (torch.randint(0, 8, (N, V), generator=gen).float(), 1.0, 20)]
    for z, top_p, top_k in cases:
        p = torch.full((N,), top_p) if top_p < 1 else None
        k = torch.full((N,), top_k, dtype=torch.int32) if top_k else None
        vllm_logp = apply_top_k_top_p_pytorch(z.clone(), k, p, allow_cpu_sync=True).log_softmax(-1)
        cut_value, cut_index, lse, _ = logprobs._nucleus_N(z, top_p, top_k, with_entropy=False)
        kept = logprobs._kept(z, torch.arange(V)[None, :], cut_value, cut_index)
        assert torch.equal(kept, torch.isfinite(vllm_logp)), (top_p, top_k)
        torch.testing.assert_close((z - lse[:, None])[kept], vllm_logp[kept], atol=1e-5, rtol=0)


class _Node:
    pass


def _cycle() -> weakref.ref:
    """A reference cycle nothing else holds: only a garbage collection frees it; returns a weak ref."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def unfrozen():
    """Automatic collection off during the test (a review: one between ``_cycle()`` and the freeze
    would free ``before`` early); the explicit collects, freezes and unfreezes work as ever."""
    gc.unfreeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_engine_build_collects_only_what_it_creates(unfrozen):
    before = _cycle()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        during = _cycle()
        gc.collect()  # what vLLM's memory profiling calls
        assert during() is None  # made during the build: collected as before
        assert before() is not None  # alive before the build: left out
        gc.freeze()  # vLLM's freeze_gc_heap at the end of its engine's start
    assert gc.get_freeze_count() > 0  # the heap stays frozen for serving, as vLLM leaves it
    gc.unfreeze()
    gc.collect()
    assert before() is None  # an unfreeze gives the objects of before back to collection


def test_a_failed_build_unfreezes(unfrozen):
    for freeze_inside in (False, True):
        with pytest.raises(RuntimeError), frozen_heap():
            if freeze_inside:
                gc.freeze()
            raise RuntimeError("engine start failed")
        assert gc.get_freeze_count() == 0


def test_the_engine_is_built_inside_frozen_heap(monkeypatch, unfrozen):
    """``VLLMEngine`` builds its ``LLM`` with the heap frozen (a stand-in build records the freeze and
    fails, so no engine is needed) and leaves it unfrozen after a failed build."""
    from system.config.rollout import VLLMEngineConfig
    from system.rollout.vllm_engine import VLLMEngine

    seen = []

    def build(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        raise RuntimeError("stand-in engine")

    monkeypatch.setattr(VLLMEngine, "_build_llm", staticmethod(build))
    with pytest.raises(RuntimeError, match="stand-in engine"):
        VLLMEngine("/nonexistent", "bf16", VLLMEngineConfig())
    assert len(seen) == 1 and seen[0] > 0 and gc.get_freeze_count() == 0
