"""Native CPU kernels (csrc/ beside this module: kernels.c and one file per kernel), built
at first use into one library, loaded through ctypes.

- the decoding step's attention over the sampler's grouped KV cache
  (`decode_attention_kernel`, used by `decode.KVCache.attend`);
- GPT-2's tanh GELU in one pass, in place or keeping its gate, and its backward
  (`gelu_kernels`, used by `gelu.gelu_tanh` and `gelu.Gelu`);
- teacher-forced attention over distinct prompts and their groups' completions, and its
  backward (`prefix_attention_kernels`, used by `attention.prompt_completion_attention`).

The library is compiled on the machine that runs it (`cc -O3 -march=native -fopenmp`),
once per set of sources, compiler and CPU, into ROOKWORLD_NATIVE_DIR (default
~/.cache/rookworld/native), and runs on torch's own OpenMP threads (torch ships
libgomp.so.1; the library links the same soname, so the loader hands it the copy already
loaded).

Everything here is optional: without a C compiler, on a CPU without AVX2 and FMA, or with
ROOKWORLD_NATIVE=0 (read once per process), every lookup below gives None and the callers keep
torch's operations (the same functions up to float rounding; tests pin both). CC picks
the compiler (default cc)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(CSRC / f for f in ("kernels.c", "decode_attention.c", "gelu.c",
                                    "prefix_attention.c"))  # one library; they share simd.h
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def enabled() -> bool:
    """ROOKWORLD_NATIVE: 1 (default) to use the kernels where they build, 0 for torch's."""
    value = os.environ.get("ROOKWORLD_NATIVE", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise ValueError(f"ROOKWORLD_NATIVE must be 0 or 1, got {value!r}")
    return value in ("1", "true", "on")


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str) -> Path:
    """The shared library for these sources, compiler and CPU: built into the cache
    directory unless there already (written to a temporary name, then renamed, so
    processes building at once never load a partial file)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    texts = [f.name + "\n" + f.read_text() for f in (*SOURCES, CSRC / "simd.h")]
    key = hashlib.sha256("\0".join([*texts, compiler, version, " ".join(FLAGS),
                                    platform.machine(), cpu_flags()]).encode()).hexdigest()
    root = Path(os.environ.get("ROOKWORLD_NATIVE_DIR")
                or Path.home() / ".cache" / "rookworld" / "native")
    out = root / f"kernels-{key[:16]}.so"
    if out.exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-2000:])
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@cache
def library() -> ctypes.CDLL | None:
    """The loaded library with its functions typed, or None where it cannot run here
    (see the module docstring); the reason goes to stderr once."""
    if not enabled():
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import torch  # torch's libgomp is loaded before the library's dependency is resolved

    del torch
    try:
        lib = ctypes.CDLL(str(_build(os.environ.get("CC", "cc"))))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"[rookworld] native kernels unavailable, using torch's operations: {e}",
              file=sys.stderr)
        return None
    if not lib.rw_available():  # built without AVX2 and FMA
        return None
    p, i, n = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lib.rw_decode_attention.argtypes = [p, n, p, p, p, i, i, i, i, i, i, ctypes.c_float]
    lib.rw_decode_attention.restype = ctypes.c_int
    lib.rw_gelu_.argtypes = [p, n]
    lib.rw_gelu_gate.argtypes = [p, p, p, n]
    lib.rw_gelu_backward.argtypes = [p, p, p, p, n]
    for fn in (lib.rw_gelu_, lib.rw_gelu_gate, lib.rw_gelu_backward):
        fn.restype = None
    f = ctypes.c_float
    lib.rw_prefix_attention.argtypes = [p, n, p, n, p, i, i, p, i, i, p, i, i, i, f]
    lib.rw_prefix_attention_backward.argtypes = [p, n, p, n, p, p, n, p, n, i, i, p, i, i, p,
                                                 i, i, i, f]
    lib.rw_prefix_attention.restype = lib.rw_prefix_attention_backward.restype = ctypes.c_int
    return lib


def decode_attention_kernel():
    """`rw_decode_attention` (csrc/decode_attention.c), or None."""
    lib = library()
    return lib.rw_decode_attention if lib is not None else None


def gelu_kernels():
    """(gelu_, gelu_gate, gelu_backward) (csrc/gelu.c), or None."""
    lib = library()
    return (lib.rw_gelu_, lib.rw_gelu_gate, lib.rw_gelu_backward) if lib is not None else None


def prefix_attention_kernels():
    """(forward, backward) of the teacher-forced attention (csrc/prefix_attention.c), or None."""
    lib = library()
    return (lib.rw_prefix_attention, lib.rw_prefix_attention_backward) if lib is not None \
        else None
