"""The vLLM engine's build with the heap alive before it left out of garbage collection.

vLLM's start calls ``gc.collect()`` five times (its memory profiling, then ``freeze_gc_heap`` at
the end of ``EngineCore.__init__``), and each walks every object the torch, transformers and vLLM
imports left (~630,000 in a rollout worker): 1.0 of the 2.0 s an engine took to build on a 2-core
AMD EPYC. :func:`frozen_heap` freezes the heap (``gc.freeze``: the permanent generation) before the
build, so those collections walk only what the engine creates, still collected as before (the
profiling measures the same garbage).

vLLM (0.32, ``vllm.utils.gc_utils.freeze_gc_heap``) ends its engine's start by freezing the whole
heap on purpose, so that collections while it serves skip the static objects. ``gc.freeze`` does
not nest, so an unfreeze after the build would undo vLLM's: after a build the heap stays frozen,
the state vLLM leaves it in without this function (on a vLLM that does not freeze, the objects of
before the build stay frozen too). A failed build unfreezes. There is no collection before the
freeze (vLLM's own freeze collects first): at that point a worker held 10 unreachable objects of
630,000, and a full collection took 0.35 s; they stay uncollected.
"""

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the block and leave it frozen after (unfrozen if the block raises)."""
    gc.freeze()
    try:
        yield
    except BaseException:
        gc.unfreeze()
        raise
