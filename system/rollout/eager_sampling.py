"""vLLM's sampler without ``torch.compile`` when the engine runs eager.

``enforce_eager`` turns off vLLM's compilation of the model, but vLLM (0.32,
``vllm.v1.sample.ops.logprobs.batched_count_greater_than``, the rank of each sampled token among
the vocabulary's log-probs) is still ``torch.compile``d, and so compiled at the first ``generate``
that asks for log-probs: every rollout worker did, at its first step. On a 2-core AMD EPYC that
first call took 15.6 s with an empty inductor cache (a 155 MB precompiled C++ header, then the
kernel; the cache was empty at every worker start while a worker's ``TMPDIR``, the run's own
directory, held it: ``actors/run_temp.py`` now links the shared one there), 1.7 s with a warm one
(the header is still preprocessed in each process), and 0.04-0.07 s with Dynamo off, the later
calls 0.03 s each.
Eager, the op is one comparison and one sum per row, so :func:`eager_sampling` turns Dynamo off
(``torch._dynamo.config.disable``) for the engine's ``generate`` calls only; the rank it computes
is the same either way, and aisrl reads only the log-probs. (The switch is process-wide while the
block runs; nothing else in a rollout worker compiles.)
"""

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def eager_sampling(active: bool) -> Iterator[None]:
    """Dynamo off for the block when ``active`` (the engine's ``enforce_eager``); nothing otherwise."""
    if not active:
        yield
        return
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield
