"""Batch dumps (``CORRECTION_SPEC.md`` section 6): one ``.npz`` per dumped step, validated on load."""

import math
import os
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from system.types import CorrectionInput

BEHAVIOUR_KEY, PROXIMAL_KEY, MASK_KEY = "rollout_logp", "train_logp", "response_mask"
"""The spec's (section 6) names of a dump's behaviour and proximal log-probs and response mask; also
the names of those columns in ``samples.json``, which reads like the dump it was made from."""
REQUIRED = (BEHAVIOUR_KEY, PROXIMAL_KEY, MASK_KEY)
OPTIONAL_ROW = ("lag", "reward", "advantage", "uid", "prompt_text", "response_text")
OPTIONAL_GRID = ("response_ids", "token_text")


class DumpError(ValueError):
    """A dump that cannot be reported on; the message names the file and the key."""


@dataclass(frozen=True)
class BatchDump:
    """The arrays of one dump: ``B`` responses padded to ``T`` tokens (the spec's ``[N, T]`` on disk; its keys:
    ``REQUIRED``, ``OPTIONAL_*``)."""

    behaviour_BT: np.ndarray  # float32, key rollout_logp
    proximal_BT: np.ndarray  # float32, key train_logp
    mask_BT: np.ndarray  # bool, key response_mask
    lag: np.ndarray  # int32 [B] (all 0 when absent)
    reward: np.ndarray | None = None  # float32 [B]
    advantage: np.ndarray | None = None  # float32 [B] (what each response carried into the loss)
    uid: np.ndarray | None = None  # str [B]
    prompt_text: np.ndarray | None = None
    response_text: np.ndarray | None = None
    response_ids: np.ndarray | None = None  # int32 [B, T]
    token_text: np.ndarray | None = None  # str [B, T]
    ignored_keys: tuple[str, ...] = ()
    """Keys of the archive that are not dump keys (a misspelt optional key: said, not read)."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.behaviour_BT.shape

    def logps(self) -> dict[str, np.ndarray]:
        """The two log-prob arrays under their dump keys (for output that names them as the file does)."""
        return {BEHAVIOUR_KEY: self.behaviour_BT, PROXIMAL_KEY: self.proximal_BT}


def _check_shape(name: str, arr: np.ndarray, want: tuple[int, ...], path: str) -> None:
    if arr.shape != want:
        raise DumpError(f"{path}: key {name!r} has shape {arr.shape}, expected {want}")


LOGP_TOLERANCE = 1e-3
"""A masked-in log-prob above this (a probability > 1 beyond rounding) is counted and said (``count_positive_logp``)."""


def _check_declared_size(zf: zipfile.ZipFile, key: str, p: str) -> None:
    """Refuse a member whose .npy header declares more data than the member holds (a corrupt or hostile
    header would otherwise make numpy allocate its declared size first: 36 TiB for one probe's file)."""
    name = f"{key}.npy" if f"{key}.npy" in zf.namelist() else key
    try:
        info = zf.getinfo(name)
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            header = f.tell()
    except (KeyError, ValueError):  # not a .npy member: reported by the caller
        return
    if dtype.hasobject:
        return
    declared = math.prod(shape) * dtype.itemsize
    if declared > info.file_size - header:
        raise DumpError(f"{p}: key {key!r} declares shape {tuple(shape)} of {dtype} ({declared} bytes) but holds "
                        f"{info.file_size - header} bytes: a corrupt archive")


def available_memory_bytes() -> int | None:
    """Memory the system can give this process now (``MemAvailable`` of ``/proc/meminfo``; free
    pages where that is missing); None when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_fits_memory(zf: zipfile.ZipFile, p: str) -> None:
    """Refuse an archive whose members, uncompressed, exceed the memory available now: every array is
    read whole, and a few MB of compressed zeros can stand for many GB (a zip bomb would otherwise run
    the machine out of memory instead of failing with a message)."""
    total = sum(info.file_size for info in zf.infolist())
    packed = sum(info.compress_size for info in zf.infolist())
    require_memory(total, p, f"its arrays hold {total / 2**30:.3g} GiB uncompressed ({packed / 2**20:.3g} MiB in "
                             "the file)")


def require_memory(need_bytes: int, p, what: str) -> None:
    """Raise ``DumpError`` naming ``p`` (and ``what`` needs the memory) when ``need_bytes`` exceed the memory
    available now; nothing when that cannot be read."""
    available = available_memory_bytes()
    if available is not None and need_bytes > available:
        raise DumpError(f"{p}: {what}, more than the {available / 2**30:.3g} GiB of memory available now: "
                        "report it on a machine with more memory")


def _check_unique_members(zf: zipfile.ZipFile, p: str) -> None:
    """Refuse an archive holding two members of one name (numpy.savez never writes one): which of them a
    reader returns depends on the reader (zipfile's lookup takes the last, its listing shows both), so a
    check passed on one copy would vouch for the other."""
    counts = Counter(zf.namelist())
    repeated = sorted(n for n, k in counts.items() if k > 1)
    if repeated:
        raise DumpError(f"{p}: member {repeated[0]!r} appears {counts[repeated[0]]} times in the archive "
                        "(a dump is written once by numpy.savez): a damaged or hand-made file")


def _read_npz(p: str) -> dict[str, np.ndarray]:
    """Every array of the archive, never unpickling (``allow_pickle=False``)."""
    if not zipfile.is_zipfile(p):
        raise DumpError(f"{p}: not an .npz archive (a batch dump is a zip of .npy arrays written by "
                        "numpy.savez; text, pickle and single .npy files are not dumps)")
    arrays = {}
    try:
        with np.load(p, allow_pickle=False) as npz:
            _check_unique_members(npz.zip, p)
            _check_fits_memory(npz.zip, p)
            for key in npz.files:
                _check_declared_size(npz.zip, key, p)
                try:
                    arrays[key] = npz[key]
                    if not isinstance(arrays[key], np.ndarray):  # a member not stored as .npy: its bytes
                        raise DumpError(f"{p}: key {key!r} is not a .npy array (a zip member numpy returns "
                                        "as raw bytes); write dumps with numpy.savez")
                except ValueError as exc:
                    if isinstance(exc, DumpError):
                        raise
                    if "allow_pickle" not in str(exc):
                        raise
                    raise DumpError(f"{p}: key {key!r} is an object array, which only unpickling could "
                                    "read; store strings as unicode arrays (np.asarray(values, dtype=str))"
                                    ) from None
    except DumpError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError,
            RuntimeError, NotImplementedError) as exc:  # zipfile: an encrypted member; an unknown compression
        raise DumpError(f"{p}: not a readable .npz batch dump ({type(exc).__name__}: {exc})") from None
    return arrays


def count_positive_logp(values: np.ndarray, mask: np.ndarray) -> int:
    """Finite masked-in log-probs above ``LOGP_TOLERANCE``: a probability above 1, which no sampler
    or forward pass gives (an upstream bug, or not log-probs at all). Section 0 of the spec defines a
    valid token by finiteness alone, so they stay valid tokens; the report counts and says them."""
    from system.correction.ratios import (
        valid_tokens,  # torch: not for every CLI command that reads dumps
    )

    with np.errstate(invalid="ignore"):
        return int(((values > LOGP_TOLERANCE) & valid_tokens(mask, values)).sum())


_NUMBER_KINDS = {"reward": "biuf", "advantage": "biuf", "response_ids": "iu", MASK_KEY: "biuf"}
"""numpy dtype kinds each numeric key may hold (b bool, i/u integers, f floats): a mask of durations
(``timedelta64``) or of records was read as a mask before (a probe)."""
_TEXT_KEYS = ("uid", "prompt_text", "response_text", "token_text")


def _check_kinds(arrays: dict[str, np.ndarray], path: str) -> None:
    """Refuse the mask and optional keys of the wrong kind; decode byte strings (UTF-8, invalid bytes replaced)
    in place."""
    for key, kinds in _NUMBER_KINDS.items():
        if key in arrays and arrays[key].dtype.kind not in kinds:
            want = "integers" if kinds == "iu" else "booleans or 0/1 numbers" if key == MASK_KEY else "real numbers"
            raise DumpError(f"{path}: key {key!r} must hold {want}, got dtype {arrays[key].dtype}")
    for key in (k for k in _TEXT_KEYS if k in arrays):
        kind = arrays[key].dtype.kind
        if kind == "S":
            arrays[key] = np.char.decode(arrays[key], "utf-8", errors="replace")
        elif kind not in "Ubiuf":
            raise DumpError(f"{path}: key {key!r} must hold text (a unicode array), got dtype {arrays[key].dtype}")


def _check_lag(lag: np.ndarray, path: str) -> None:
    """Refuse a non-integer or negative lag (learner version minus behaviour version is >= 0)."""
    if lag.dtype.kind not in "iu":  # a timedelta64 is a subtype of integer for numpy (a probe)
        whole = np.issubdtype(lag.dtype, np.floating) and bool(np.all(np.isfinite(lag) & (lag == np.round(lag))))
        if not whole:
            raise DumpError(f"{path}: key 'lag' must hold integers, got dtype {lag.dtype}")
    negative = np.flatnonzero(lag < 0)
    if negative.size:
        raise DumpError(
            f"{path}: key 'lag' has {negative.size} negative value(s) (first {lag[negative[0]]} at row "
            f"{negative[0]}); a lag (learner version minus behaviour version) is >= 0"
        )
    if lag.size and lag.max() > np.iinfo(np.int32).max:
        raise DumpError(f"{path}: key 'lag' holds {lag.max()}, beyond int32")


def _dumps_hint(directory: Path) -> str:
    """Where the dumps of a run directory (or a dumps directory) are, for the error message."""
    last = newest_dump(directory) or newest_dump(directory / "dumps")
    if last is not None:
        return f"give one of its dump files, e.g. the last: {last}"
    return "give a .npz dump file (a run writes them as <output_dir>/dumps/step_XXXXXX.npz)"


def load_dump(path: str | Path) -> BatchDump:
    """Read and validate a dump; raises DumpError naming the file and the offending key."""
    p = str(path)
    if Path(p).is_dir():
        raise DumpError(f"{p}: a directory, not a dump file; {_dumps_hint(Path(p))}")
    if not Path(p).is_file():
        raise DumpError(f"{p}: {'not a regular file' if Path(p).exists() else 'no such file'}")  # a FIFO, a device
    arrays = _read_npz(p)
    for key in REQUIRED:
        if key not in arrays:
            raise DumpError(f"{p}: missing required key {key!r} (have {sorted(arrays)})")
    behaviour = arrays[BEHAVIOUR_KEY]
    if behaviour.ndim != 2:
        raise DumpError(f"{p}: key {BEHAVIOUR_KEY!r} must be 2-D [N, T], got shape {behaviour.shape}")
    n, t = behaviour.shape
    if n == 0 or t == 0:
        raise DumpError(f"{p}: empty batch: key {BEHAVIOUR_KEY!r} has shape {behaviour.shape}")
    for key in (PROXIMAL_KEY, MASK_KEY) + tuple(k for k in OPTIONAL_GRID if k in arrays):
        _check_shape(key, arrays[key], (n, t), p)
    for key in (k for k in OPTIONAL_ROW if k in arrays):
        _check_shape(key, arrays[key], (n,), p)
    for key in (BEHAVIOUR_KEY, PROXIMAL_KEY):
        if not np.issubdtype(arrays[key].dtype, np.floating):
            raise DumpError(f"{p}: key {key!r} must be floating point, got {arrays[key].dtype}")
    _check_kinds(arrays, p)
    mask = arrays[MASK_KEY]
    if mask.dtype != np.bool_ and not np.isin(mask, (0, 1)).all():
        raise DumpError(f"{p}: key {MASK_KEY!r} must hold only 0/1")
    # A mask that selects no token is a legal batch: the report says so, with null statistics.
    ids = arrays.get("response_ids")
    ids = ids[mask != 0] if ids is not None else None  # padding may hold anything (e.g. -100): never read
    if ids is not None and ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise DumpError(f"{p}: key 'response_ids' holds {ids.min() if ids.min() < 0 else ids.max()} at a response "
                        f"token; token ids are in 0 .. {np.iinfo(np.int32).max}")
    lag = arrays.get("lag")
    if lag is not None:
        _check_lag(lag, p)
    # float64 values beyond float32's range become +-inf: non-finite, excluded and counted like any
    # other (spec section 0), without numpy's overflow warning on the console
    with np.errstate(over="ignore"):
        behaviour32 = behaviour.astype(np.float32, copy=False)
        proximal32 = arrays[PROXIMAL_KEY].astype(np.float32, copy=False)
        reward = arrays["reward"].astype(np.float32) if "reward" in arrays else None
        advantage = arrays["advantage"].astype(np.float32) if "advantage" in arrays else None
    return BatchDump(
        behaviour_BT=behaviour32,
        proximal_BT=proximal32,
        mask_BT=mask.astype(bool, copy=False),
        lag=(lag if lag is not None else np.zeros(n)).astype(np.int32),
        reward=reward,
        advantage=advantage,
        uid=arrays.get("uid"),
        prompt_text=arrays.get("prompt_text"),
        response_text=arrays.get("response_text"),
        response_ids=arrays["response_ids"].astype(np.int32) if "response_ids" in arrays else None,
        token_text=arrays.get("token_text"),
        ignored_keys=tuple(sorted(set(arrays) - set(REQUIRED) - set(OPTIONAL_ROW) - set(OPTIONAL_GRID))),
    )


def _storable(path, key: str, value) -> np.ndarray:
    """``value`` as an array that loads without pickle: object arrays (of str) become unicode arrays."""
    arr = np.asarray(value)
    if arr.dtype == object:
        if not all(isinstance(v, str) for v in arr.flat):
            raise DumpError(f"{path}: key {key!r} is an object array; only one of str can be stored")
        arr = arr.astype(str)
    return arr


def numbered_dumps(directory: str | Path) -> list[tuple[int, Path]]:
    """The dumps ``step_XXXXXX.npz`` in ``directory`` as ``(step, path)``, by step; partial files of an
    interrupted save (hidden names) and other files are not dumps. Empty when there is no directory."""
    try:
        return sorted((int(p.stem[5:]), p) for p in Path(directory).glob("step_*.npz") if p.stem[5:].isdigit())
    except OSError:
        return []


def newest_dump(directory: str | Path, up_to_step: int | None = None) -> Path | None:
    """The run's newest dump in ``directory`` at or before ``up_to_step`` (a later one belongs to an
    attempt abandoned after the checkpoint a run resumed from); None if none."""
    kept = [p for n, p in numbered_dumps(directory) if up_to_step is None or n <= up_to_step]
    return kept[-1] if kept else None


def save_dump(path: str | Path, **arrays: np.ndarray) -> Path:
    """Write a dump atomically (temp file, then rename); keys as in section 6."""
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise DumpError(f"{path}: cannot save without {missing}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial.npz")  # hidden, and matched by no ``step_*.npz`` glob
    try:
        np.savez_compressed(tmp, **{k: _storable(path, k, v) for k, v in arrays.items() if v is not None})
        tmp.replace(out)
    except OSError as exc:  # a full disk: no partial file left, and the message names the dump
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(out)) from None
    return out


def token_text_grid(id_to_token, response_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``token_text`` [N, T] from ids through ``id_to_token`` (a tokenizer's ``convert_ids_to_tokens``)."""
    vocab = {int(i): str(id_to_token(int(i))) for i in np.unique(response_ids[mask.astype(bool)])}
    grid = np.full(response_ids.shape, "", dtype=object)
    rows, cols = np.nonzero(mask)
    grid[rows, cols] = [vocab[int(i)] for i in response_ids[rows, cols]]
    return grid.astype(str)


def dump_arrays(batch: CorrectionInput, token_text: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The section 6 arrays of one batch: the spec's key names for the correction's typed input."""
    arrays = {
        BEHAVIOUR_KEY: batch.behaviour_BT, PROXIMAL_KEY: batch.proximal_BT, MASK_KEY: batch.mask_BT,
        "response_ids": batch.response_ids_BT, "lag": batch.lag_B, "reward": batch.reward_B,
        "advantage": batch.advantage_B, "uid": np.array(batch.uids, dtype=str),
        "prompt_text": np.array(batch.prompt_texts, dtype=str), "response_text": np.array(batch.response_texts, dtype=str),
    }
    if token_text is not None:
        arrays["token_text"] = token_text
    return arrays


def save_batch_dump(path: str | Path, batch: CorrectionInput, token_text: np.ndarray | None = None) -> Path:
    """Write ``batch`` as a section 6 dump (:func:`dump_arrays`, then :func:`save_dump`)."""
    return save_dump(path, **dump_arrays(batch, token_text))
