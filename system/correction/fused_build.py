"""Build (and find) the fused correction pass, ``fused_pass.cpp``, as a plain shared library.

``make`` builds it at install (``python -m system.correction.fused_build``); it needs only a C++
compiler (``c++``/``g++``), links nothing but the C++ runtime and is loaded with ``ctypes``, so it
never conflicts with vLLM or torch in the same process. Without a compiler nothing fails: the
correction core uses its torch path (``system.correction.fused.available()`` says which).
The library is compiled for the CPU it is built on (``-march=native``): build it on the machine
that runs it (``make`` does), never copy it across machines.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("fused_pass.cpp")
LIBRARY = Path(__file__).with_name("_fused_pass.so")
FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread",
         # vectorised sums, keeping NaN / inf semantics (no -ffast-math); exp / expm1 are inline
         "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math"]
LIBS = ["-lm"]


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
    done = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", str(tmp), *LIBS], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {SOURCE.name} with {cxx} failed:\n{done.stderr[-2000:]}")
    tmp.replace(LIBRARY)  # atomic: a process loading it never sees a half-written file
    return LIBRARY


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
