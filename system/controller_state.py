"""The controller half of a run checkpoint, ``<checkpoint>/controller.pkl``: written with the CRC-32
of its pickled state (then renamed), read with that CRC checked, and checked for every part a
resumed run needs (``CONTROLLER_KEYS``) and for parts that disagree. The run directory and the
choice of checkpoint are ``system.run_state``'s.
"""

import os
import pickle
import zlib
from pathlib import Path

from system.data.sampler import check_cursor

CONTROLLER_FILE = "controller.pkl"
CONTROLLER_KEYS = ("step", "sampler", "buffer", "correction", "rng", "wandb_run_id")
"""The controller half: policy version (= steps done), sampler cursor and ledger, the buffered
groups, the correction service's state (AIS), the driver's RNG states, the W&B run to resume."""


_SEALED = "aisrl_controller_crc32"
"""The key of the envelope ``controller.pkl`` holds: ``{_SEALED: crc32(inner), "state": inner}``, where
``inner`` is the pickled state; a file of an older run holds the state dict itself."""


def save_controller_state(ckpt: str | Path, state: dict) -> None:
    """``controller.pkl``: the state pickled, with the CRC-32 of those bytes, written then renamed."""
    path = Path(ckpt) / CONTROLLER_FILE
    tmp = path.with_suffix(".tmp")
    inner = pickle.dumps(state)
    with open(tmp, "wb") as f:
        pickle.dump({_SEALED: zlib.crc32(inner), "state": inner}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the part."""


def read_controller_state(ckpt: str | Path) -> dict:
    """The controller half of ``ckpt`` as written (its CRC-32 checked), its parts not checked."""
    path = Path(ckpt) / CONTROLLER_FILE
    intact = True
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
        if isinstance(state, dict) and _SEALED in state:  # else an older run's file: the state itself
            inner = state.get("state")
            intact = isinstance(inner, bytes) and zlib.crc32(inner) == state[_SEALED]
            state = pickle.loads(inner) if intact else None
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path} is truncated or corrupt ({type(exc).__name__}: {exc})") from None
    if not intact:
        raise CheckpointError(f"{path}: its bytes differ from those written (CRC-32 mismatch: damaged or replaced)")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a controller state")
    return state


def load_controller_state(ckpt: str | Path) -> dict:
    """The controller half of ``ckpt``: :func:`read_controller_state`, checked with :func:`check_controller_state`."""
    state = read_controller_state(ckpt)
    try:
        check_controller_state(state, Path(ckpt) / CONTROLLER_FILE)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return state


def check_controller_state(state: dict, where: str | Path) -> None:
    """Raise ``ValueError`` naming ``where`` and the part when a part is missing or the parts disagree.

    Checked: every key of ``CONTROLLER_KEYS``; the RNG states of python, numpy and torch; the
    AIS state of the correction service; that the sampler's cursor agrees with its ledger; and that the buffered groups are exactly the
    prompts the sampler's ledger marks generated (a lost buffer would otherwise leave them
    neither trained nor re-issued).
    """
    missing = [k for k in CONTROLLER_KEYS if k not in state]
    if missing:
        raise ValueError(f"{where}: checkpoint lacks {', '.join(missing)}; it cannot resume this run exactly")
    missing = [f"rng.{k}" for k in ("python", "numpy", "torch") if k not in state["rng"]]
    missing += [] if "ais" in state["correction"] else ["correction.ais"]
    if missing:
        raise ValueError(f"{where}: checkpoint lacks {', '.join(missing)}; it cannot resume this run exactly")
    if "num_prompts" in state["sampler"]:  # (the sampler knows the source's length on load otherwise)
        try:
            check_cursor(state["sampler"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    generated = {pid for pid, s in state["sampler"]["state"].items() if s == "generated"}
    buffered = {g.prompt.prompt_id for g in state["buffer"]}
    if generated != buffered:
        raise ValueError(
            f"{where}: the buffer holds {len(buffered)} groups but the sampler's ledger has {len(generated)} "
            f"generated prompts ({len(generated - buffered)} not in the buffer, {len(buffered - generated)} "
            "not in the ledger): the buffer and the sampler are from different moments")
