"""Thin Ray shells over the ``system`` core, the controller and the ``aisrl`` command line."""

import logging
import os

if os.environ.get("AISRL_VERBOSE", "") in ("", "0"):
    # torch logs "Triton not available" at WARNING each time vLLM registers a kernel on a CPU machine
    # (no Triton there, by design); keep it off the console unless AISRL_VERBOSE=1
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
