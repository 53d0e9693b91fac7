"""Build (and find) the fused correction pass, ``fused_pass.cpp``, as a plain shared library.

``make`` builds it at install (``python -m system.correction.fused_build``); it needs only a C++
compiler (``c++``/``g++``), links nothing but the C++ runtime and OpenMP's (``libgomp.so.1``, the
runtime torch itself loads, so in a process with torch both share one runtime and one set of
threads) and is loaded with ``ctypes``, so it never conflicts with vLLM or torch in the same
process. A compiler without OpenMP builds it on ``std::thread`` instead. Without a compiler nothing
fails: the correction core uses its torch path (``system.correction.fused.available()`` says which).
The library is compiled for the CPU it is built on (``-march=native``), so its file is named for
that CPU's instruction sets (``_fused_pass.<isa key>.so``, :func:`isa_key`): a checkout shared by
machines of different CPUs (a SLURM login node and its compute nodes on one file system) holds one
library per kind of CPU, each process loads (or builds) its own, and none runs code its CPU lacks.
"""

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from system.cpu_info import cpuinfo_fields

SOURCE = Path(__file__).with_name("fused_pass.cpp")
_ISA_FLAG = re.compile(r"^(sse|ssse3|avx|fma|f16c|bmi|amx|vaes|vpclmulqdq|gfni|adx|popcnt|movbe|abm|lzcnt|"
                       r"sha_ni|aes|pclmulqdq|cx16|xsave|clwb|clflushopt|rdrand|rdseed|serialize|movdir)")
"""The /proc/cpuinfo flags that say which instructions ``-march=native`` may use."""


def isa_key(cpuinfo: str | None = None) -> str:
    """A short name for this CPU's instruction sets: the machine and a hash of its ISA flags
    (``/proc/cpuinfo``'s first ``flags`` line, or ``cpuinfo`` as given); CPUs that differ in any
    flag ``-march=native`` could use get different keys."""
    fields = cpuinfo_fields(cpuinfo)
    flags = sorted({f for f in fields.get("flags", fields.get("Features", "")).split() if _ISA_FLAG.match(f)})
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:10]}"


LIBRARY = Path(__file__).with_name(f"_fused_pass.{isa_key()}.so")
"""This machine's library."""
FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread",
         # vectorised sums, keeping NaN / inf semantics (no -ffast-math); exp / expm1 are inline
         "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math"]
LIBS = ["-lm"]
OPENMP = ["-fopenmp"]
"""Tried first; a compiler that refuses it builds the ``std::thread`` variant."""


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else ``c++`` or ``g++`` on the PATH; None if there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return name
    return None


def build(force: bool = False) -> Path | None:
    """Compile ``fused_pass.cpp`` next to it unless an up-to-date library is there; the library's
    path, or None when no compiler is found. A failing compile raises with the compiler's output."""
    if not force and LIBRARY.is_file() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    cxx = compiler()
    if cxx is None:
        return None
    tmp = LIBRARY.with_suffix(f".{os.getpid()}.tmp")
    for extra in (OPENMP, []):
        done = subprocess.run([cxx, *FLAGS, *extra, str(SOURCE), "-o", str(tmp), *LIBS], capture_output=True, text=True)
        # an OpenMP build must also load where it is used (after torch, whose libgomp.so.1 it then shares)
        if done.returncode == 0 and (not extra or _loads_after_torch(tmp)):
            break
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {SOURCE.name} with {cxx} failed:\n{done.stderr[-2000:]}")
    tmp.replace(LIBRARY)  # atomic: a process loading it never sees a half-written file
    return LIBRARY


def _loads_after_torch(path: Path) -> bool:
    """Whether the library at ``path`` loads in a fresh interpreter that has imported torch (as
    ``system.correction.fused`` loads it); a compiler whose OpenMP runtime is not on the loader's
    path builds a library that does not."""
    code = "import ctypes, sys, torch; ctypes.CDLL(sys.argv[1])"
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True).returncode == 0


def main() -> None:
    try:
        path = build(force="--force" in sys.argv)
    except RuntimeError as exc:
        print(f"fused correction pass not built ({exc}); the torch path will be used", file=sys.stderr)
        return
    if path is None:
        print("fused correction pass not built (no C++ compiler): the torch path will be used", file=sys.stderr)
    else:
        print(f"fused correction pass: {path.name}")


if __name__ == "__main__":
    main()
