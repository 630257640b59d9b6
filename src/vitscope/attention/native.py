"""Native CPU kernels, built at first use: sparsemax, entmax-1.5 and alpha-entmax forward and backward
(``sparse_rows.cpp``), and softmax attention's locality row sums without its probabilities (``locality_rows.cpp``).

The C++ sources are compiled once per machine (about a second) with the system's C++ compiler (``$CXX``, else
``c++``), ``-O3 -march=native`` and OpenMP where available (so the kernels share PyTorch's thread pool), into
``$VITSCOPE_CACHE/native`` (default ``~/.cache/vitscope/native``), written atomically and keyed by the source,
the flags, the compiler and the CPU, then loaded with ctypes (which releases the GIL while a kernel runs). A
flag set that fails to build leaves a ``.failed`` note beside it so that later processes do not retry it
(delete the folder to rebuild). Where no compiler works, a warning says so once and vitscope uses its
compiled-PyTorch kernels instead. ``VITSCOPE_NATIVE=0`` or ``set_native(False)`` turns this path off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

from vitscope.files import atomic_write_bytes, cache_root

KINDS = {"sparsemax": 0, "entmax15": 1, "alpha": 2}  # the kind codes of sparse_rows.cpp
MAX_PASSES = 32  # a row still open after this many passes is left to the exact eager solver
_HERE = Path(__file__).parent
_SOURCES = (_HERE / "sparse_rows.cpp", _HERE / "locality_rows.cpp")
_HEADERS = (_HERE / "vector_math.h", _HERE / "parallel.h")
# tried in order: OpenMP (PyTorch's thread pool) where the compiler has it, else std::thread with OpenMP's
# vectorisation pragmas only; -march=native on x86 and most compilers, -mcpu=native where that is the spelling
_FLAG_SETS = (["-march=native", "-fopenmp"], ["-mcpu=native", "-fopenmp"], ["-march=native", "-fopenmp-simd"],
              ["-mcpu=native", "-fopenmp-simd"], ["-fopenmp-simd"], [])
_COMMON_FLAGS = ["-O3", "-fno-math-errno", "-shared", "-fPIC", "-pthread", "-std=c++17"]
_ABI_VERSION = 3
_MIN_ELEMENTS_PER_THREAD = 1 << 15

_enabled = os.environ.get("VITSCOPE_NATIVE", "1") != "0"
_library: ctypes.CDLL | None = None
_failed = False


def set_native(enabled: bool) -> None:
    """Turn the native CPU kernels on or off for this process."""
    global _enabled
    _enabled = enabled


def cache_dir() -> Path:
    return cache_root() / "native"


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _compiler() -> str:
    """``$CXX``, else the first of c++, g++, clang++ on PATH; RuntimeError when there is none."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler on PATH (set CXX)")
    return compiler


def _compile(compiler: str) -> Path:
    """Build the library (or find it built) and return its path; raise RuntimeError when no flag set works."""
    source = b"\0".join(path.read_bytes() for path in (*_SOURCES, *_HEADERS))
    errors = []
    for flags in _FLAG_SETS:
        key = hashlib.sha256(b"\0".join([source, " ".join(_COMMON_FLAGS + flags).encode(), compiler.encode(),
                                         _cpu_signature().encode()])).hexdigest()[:16]
        target = cache_dir() / f"vitscope_native-{key}.so"
        failed = target.with_suffix(".failed")  # this flag set did not build here: don't retry every process
        if target.exists():
            return target
        if failed.exists():
            errors.append(failed.read_text())
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            run = subprocess.run([compiler, *_COMMON_FLAGS, *flags, *map(str, _SOURCES), "-o", str(built)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                os.replace(built, target)  # atomic: other processes see the old state or the whole library
                return target
        last_line = (run.stderr.strip().splitlines() or ["no message"])[-1]
        errors.append(f"{Path(compiler).name} {' '.join(flags) or '(default flags)'}: {last_line}")
        atomic_write_bytes(failed, errors[-1].encode())
    raise RuntimeError("; ".join(errors))


def library() -> ctypes.CDLL | None:
    """The loaded kernels, building them on first call; None where they are off or cannot be built."""
    global _library, _failed
    if not _enabled or _failed:
        return None
    if _library is None:
        try:
            path = _compile(_compiler())
            lib = ctypes.CDLL(str(path))
            if lib.vitscope_abi_version() != _ABI_VERSION:
                raise RuntimeError(f"{path} is stale: delete it to rebuild")
            head, sizes = [ctypes.c_int, ctypes.c_float], [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
            lib.vitscope_forward.argtypes = head + [ctypes.c_void_p] * 3 + sizes + [ctypes.c_int]
            lib.vitscope_backward.argtypes = head + [ctypes.c_void_p] * 3 + sizes
            lib.vitscope_softmax_locality.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]
            lib.vitscope_softmax_locality.restype = None
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            _failed = True
            warnings.warn(f"vitscope: native CPU kernels unavailable ({err}); using the compiled PyTorch kernels. "
                          "Install a C++17 compiler or point CXX at one (VITSCOPE_NATIVE=0 silences this)",
                          stacklevel=2)
            return None
        _library = lib
    return _library


def runs_on(x: Tensor) -> bool:
    """Whether the native kernels can take ``x``: on the CPU, float32/16 or bfloat16, not empty, and built."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float16, torch.bfloat16) and x.dim() > 0
            and x.shape[-1] > 0 and library() is not None)


def applies(x: Tensor, kind: str) -> bool:
    """Whether the native normaliser ``kind`` can take ``x``."""
    return kind in KINDS and runs_on(x)


def forward(kind: str, x: Tensor, alpha: float = 1.5, max_passes: int | None = None) -> tuple[Tensor, Tensor]:
    """Probabilities (float32, shape of ``x``) along the last dim and per-row ``converged`` flags (x.shape[:-1]);
    a row not proven exact within ``max_passes`` (default MAX_PASSES) threshold passes is flagged False, for the
    caller to finish. ``alpha`` is used by kind "alpha" only."""
    lib = _loaded()
    rows_in = x.detach().to(torch.float32).contiguous()
    n = rows_in.shape[-1]
    y = torch.empty_like(rows_in)
    passes = torch.empty(rows_in.shape[:-1], dtype=torch.uint8)
    _check(lib.vitscope_forward(KINDS[kind], alpha, rows_in.data_ptr(), y.data_ptr(), passes.data_ptr(),
                                y.numel() // n, n, _threads(y), MAX_PASSES if max_passes is None else max_passes))
    return y, passes > 0


def backward(kind: str, grad: Tensor, y: Tensor, alpha: float = 1.5) -> Tensor:
    """Closed-form VJP (float32, shape of ``y``) of the forward whose float32 output is ``y``."""
    lib = _loaded()
    grad = grad.to(torch.float32).contiguous()
    y = y.to(torch.float32).contiguous()
    out = torch.empty_like(y)
    _check(lib.vitscope_backward(KINDS[kind], alpha, grad.data_ptr(), y.data_ptr(), out.data_ptr(),
                                 y.numel() // y.shape[-1], y.shape[-1], _threads(y)))
    return out


def softmax_locality(logits: Tensor, distances: Tensor, prefix: int) -> tuple[Tensor, Tensor, Tensor]:
    """``locality_row_sums`` of softmax(logits) over the patch block, computed from the logits (B, H, T, T) and
    patch distances (T - prefix, T - prefix) without the probabilities: mass, weighted, plogp, each
    (B, H, T - prefix)."""
    lib = _loaded()
    logits = logits.detach().to(torch.float32).contiguous()
    t = logits.shape[-1]
    if logits.shape[-2] != t or tuple(distances.shape) != (t - prefix, t - prefix):
        raise ValueError(f"logits {tuple(logits.shape)} with {prefix} prefix tokens do not match distances "
                         f"{tuple(distances.shape)}; expected square logits and (T - prefix)^2 distances")
    distances = distances.to(torch.float32).contiguous()
    mass, weighted, plogp = (torch.empty((*logits.shape[:-2], t - prefix)) for _ in range(3))
    lib.vitscope_softmax_locality(logits.data_ptr(), distances.data_ptr(), mass.data_ptr(), weighted.data_ptr(),
                                  plogp.data_ptr(), logits.numel() // (t * t), t, prefix, _threads(logits))
    return mass, weighted, plogp


def _loaded() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("native kernels are unavailable; check applies() first")
    return lib


def _check(status: int) -> None:
    if status != 0:  # KINDS and sparse_rows.cpp disagree: a stale build
        raise RuntimeError(f"native kernel returned {status}: delete {cache_dir()} to rebuild")


def _threads(x: Tensor) -> int:
    return max(1, min(torch.get_num_threads(), x.numel() // _MIN_ELEMENTS_PER_THREAD))
