"""Native CPU kernels, built at first use: sparsemax, entmax-1.5 and alpha-entmax forward and backward
(``sparse_rows.cpp``), and softmax attention's locality statistics straight from its queries and keys, forming
neither logits nor probabilities (``locality_rows.cpp``).

``NativeKernels`` owns one build of the C++ sources: compiled once per machine (about a second) with the system's
C++ compiler (``$CXX``, else ``c++``), ``-O3 -march=native`` and OpenMP where available (so the kernels share
PyTorch's thread pool), into ``$VITSCOPE_CACHE/native`` (default ``~/.cache/vitscope/native``), written atomically
and keyed by the sources, the flags, the compiler and the CPU, then loaded with ctypes (which releases the GIL
while a kernel runs). A failed build is remembered by that object only, never on disk, so a fixed compiler is
picked up by the next process (or by ``reset()``). Where no compiler works, a warning says so once and the
normalisers take their compiled-PyTorch or eager paths. ``kernels()`` is the instance in force (that of
``fast_paths(kernels=...)``, else the process's shared one); the module-level functions below call it. Whether
the normalisers and streamed metrics use it at all is chosen in ``paths.py``.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from functools import cache
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from vitscope.attention.kinds import kind as kind_named
from vitscope.attention.paths import current
from vitscope.cache_dir import cache_root

MAX_PASSES = 32  # a row still open after this many passes is left to the exact eager solver
HERE = Path(__file__).parent
SOURCES = (HERE / "sparse_rows.cpp", HERE / "locality_rows.cpp")
HEADERS = (HERE / "vector_math.h", HERE / "parallel.h", HERE / "row_tiles.h", HERE / "alpha_rows.h",
           HERE / "alpha_backward.h", HERE / "kinds.def")
# tried in order: OpenMP (PyTorch's thread pool) where the compiler has it, else std::thread with OpenMP's
# vectorisation pragmas only; -march=native on x86 and most compilers, -mcpu=native where that is the spelling
FLAG_SETS = (("-march=native", "-fopenmp"), ("-mcpu=native", "-fopenmp"), ("-march=native", "-fopenmp-simd"),
             ("-mcpu=native", "-fopenmp-simd"), ("-fopenmp-simd",), ())
_COMMON_FLAGS = ("-O3", "-fno-math-errno", "-shared", "-fPIC", "-pthread", "-std=c++17")
_ABI_VERSION = 8
_MIN_ELEMENTS_PER_THREAD = 1 << 15
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # read and written by the kernels; float16 is converted first


def cache_dir() -> Path:
    return cache_root() / "native"


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() or platform.machine()


def find_compiler() -> str:
    """``$CXX``, else the first of c++, g++, clang++ on PATH; RuntimeError when there is none."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler on PATH (set CXX)")
    return compiler


def build(compiler: str, sources=SOURCES, flag_sets=FLAG_SETS, headers=HEADERS) -> Path:
    """Build the library (or find it built) and return its path; RuntimeError naming each flag set's error
    when none builds."""
    source = b"\0".join(path.read_bytes() for path in (*sources, *headers))
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256(b"\0".join([source, " ".join(_COMMON_FLAGS + flags).encode(), compiler.encode(),
                                         _cpu_signature().encode()])).hexdigest()[:16]
        target = cache_dir() / f"vitscope_native-{key}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            run = subprocess.run([compiler, *_COMMON_FLAGS, *flags, *map(str, sources), "-o", str(built)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                os.replace(built, target)  # atomic: other processes see the old state or the whole library
                return target
        last_line = (run.stderr.strip().splitlines() or ["no message"])[-1]
        errors.append(f"{Path(compiler).name} {' '.join(flags) or '(default flags)'}: {last_line}")
    raise RuntimeError("; ".join(errors))


class NativeKernels:
    """One build of the native kernels, loaded on first use; ``error`` says why it is unavailable, if it is.
    ``max_passes``: the threshold passes a row gets before it is left to the eager solver."""

    def __init__(self, sources=SOURCES, flag_sets=FLAG_SETS, max_passes: int = MAX_PASSES):
        self.sources, self.flag_sets, self.max_passes = tuple(sources), tuple(flag_sets), max_passes
        self.error: str | None = None
        self._library: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget the loaded library and any failure: the next use builds (or finds) it again."""
        with self._lock:
            self._library, self.error = None, None

    def library(self) -> ctypes.CDLL | None:
        """The loaded kernels, building them on first call; None where they cannot be built here."""
        with self._lock:
            if self._library is None and self.error is None:
                try:
                    self._library = self._load(build(find_compiler(), self.sources, self.flag_sets))
                except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                    self.error = str(err)
                    warnings.warn(f"vitscope: native CPU kernels unavailable ({err}); using the compiled PyTorch "
                                  "kernels. Install a C++17 compiler or point CXX at one (VITSCOPE_NATIVE=0 "
                                  "silences this)", stacklevel=3)
            return self._library

    @staticmethod
    def _load(path: Path) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(path))
        if lib.vitscope_abi_version() != _ABI_VERSION:
            raise RuntimeError(f"{path} is stale: delete it to rebuild")
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.vitscope_forward.argtypes = [i32, i32, p, i64, i64, p, p, p, i64, i64, i32, i32]
        lib.vitscope_backward.argtypes = [i32, i32, p, i64, i64, p, p, p, p, i64, i64, i32]
        lib.vitscope_softmax_locality.argtypes = [p] * 6 + [i64] * 6 + [ctypes.c_float, i32]
        lib.vitscope_softmax_locality.restype = None
        return lib

    def runs_on(self, x: Tensor) -> bool:
        """Whether these kernels can take ``x``: on the CPU, float32/16 or bfloat16, not empty, and built."""
        return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
                and x.dim() > 0 and x.shape[-1] > 0 and self.library() is not None)

    def forward(self, kind: str, x: Tensor, alpha: Tensor | float | None = None,
                max_passes: int | None = None) -> tuple[Tensor, Tensor]:
        """Probabilities (shape of ``x``; bfloat16 for bfloat16 ``x``, else float32) along the last dim and per-row
        ``converged`` flags (x.shape[:-1]); a row not proven exact within ``max_passes`` (default: the object's)
        threshold passes is flagged False for the caller to finish, as is every row of kind "alpha" whose alpha lies
        outside (1, 2].
        ``alpha`` (kind "alpha" only): a float or a tensor broadcastable to x.shape[:-1] (or to x.shape[:-1] + (1,)):
        one value, one per head, one per row."""
        lib = self._loaded()
        rows_in = _kernel_input(x)
        n = rows_in.shape[-1]
        rows = rows_in.numel() // n
        y = torch.empty(rows_in.shape, dtype=rows_in.dtype)
        converged = torch.empty(rows_in.shape[:-1], dtype=torch.bool)  # written as 0 / 1 bytes
        alphas = _row_alphas(alpha, x.shape[:-1]) if kind == "alpha" else RowAlphas(None, 1, 1)
        _check(lib.vitscope_forward(kind_named(kind).code, _DTYPES[rows_in.dtype], _pointer(alphas.values),
                                    alphas.inner, alphas.period,
                                    rows_in.data_ptr(), y.data_ptr(), converged.data_ptr(), rows, n, _threads(y),
                                    self.max_passes if max_passes is None else max_passes))
        return y, converged

    def backward(self, kind: str, grad: Tensor, y: Tensor, alpha: Tensor | float | None = None,
                 alpha_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """Closed-form VJP (shape and dtype of ``y``: bfloat16 or float32) of the forward whose output is ``y``,
        and with ``alpha_grad`` (kind "alpha") the gradient with respect to ``alpha`` (float32, alpha's shape: one
        value per head for a per-head alpha, summed over its rows inside the kernel; () for a float), 0 where alpha
        is 1. ``grad`` is read in ``y``'s dtype."""
        lib = self._loaded()
        dtype = y.dtype if y.dtype in _DTYPES else torch.float32
        y = y.detach().to(dtype).contiguous()
        grad = grad.detach().to(dtype).contiguous()
        out = torch.empty_like(y)
        with_grad = alpha_grad and kind == "alpha"
        alphas = (_row_alphas(alpha, y.shape[:-1], collapse_expanded=not with_grad) if kind == "alpha"
                  else RowAlphas(None, 1, 1))
        d_alpha = torch.empty(alphas.period) if with_grad else None
        _check(lib.vitscope_backward(kind_named(kind).code, _DTYPES[grad.dtype], _pointer(alphas.values),
                                     alphas.inner, alphas.period, grad.data_ptr(), y.data_ptr(), out.data_ptr(),
                                     _pointer(d_alpha), y.numel() // y.shape[-1], y.shape[-1], _threads(y)))
        if d_alpha is not None:
            shape = torch.as_tensor(alpha).shape
            rows = y.shape[:-1] + (1,) * (len(shape) - len(y.shape[:-1]))  # alpha may carry the rows' (..., 1)
            d_alpha = d_alpha.reshape(rows).sum_to_size(shape) if alphas.per_row else d_alpha.reshape(shape)
        return out, d_alpha

    def softmax_locality(self, q: Tensor, k: Tensor, scale: float, distances: Tensor, prefix: int) -> Tensor:
        """``vitscope.metrics.locality.map_sums`` (B, H, 4) float64 of softmax(scale q k^T) over the patch block,
        from queries (B, H, Tq, dim), keys (B, H, Tk, dim) and patch distances (Tq - prefix, Tk - prefix), forming
        neither logits nor probabilities. q and k are read in place when float32 with a contiguous last dim (the
        views of a qkv projection)."""
        lib = self._loaded()
        q, k = (_strided_rows(t) for t in (q, k))
        if q.dim() != 4 or k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]:
            raise ValueError(f"queries {tuple(q.shape)} and keys {tuple(k.shape)} must be (batch, heads, tokens, "
                             "head_dim) with equal batch, heads and head_dim")
        b, h, tq, dim = q.shape
        tk = k.shape[-2]
        if not 0 <= prefix < min(tq, tk) or tuple(distances.shape) != (tq - prefix, tk - prefix):
            raise ValueError(f"queries {tuple(q.shape)} and keys {tuple(k.shape)} with {prefix} prefix tokens do not "
                             f"match distances {tuple(distances.shape)}; expected (Tq - prefix, Tk - prefix)")
        distances = distances.detach().to(torch.float32).contiguous()
        sums = torch.empty(b, h, 4, dtype=torch.float64)
        threads = max(1, min(torch.get_num_threads(), b * h * tq * tk // _MIN_ELEMENTS_PER_THREAD))
        lib.vitscope_softmax_locality(q.data_ptr(), k.data_ptr(), distances.data_ptr(), sums.data_ptr(),
                                      (ctypes.c_int64 * 3)(*q.stride()[:3]), (ctypes.c_int64 * 3)(*k.stride()[:3]),
                                      b, h, tq, tk, dim, prefix, float(scale), threads)
        return sums

    def _loaded(self) -> ctypes.CDLL:
        lib = self.library()
        if lib is None:
            raise RuntimeError(f"native kernels are unavailable ({self.error}); check runs_on() first")
        return lib


@cache
def shared_kernels() -> NativeKernels:
    """The process's shared native kernels."""
    return NativeKernels()


def kernels() -> NativeKernels:
    """The native kernels in force here: those of the innermost ``fast_paths(kernels=...)``, else the shared ones."""
    return current().kernels or shared_kernels()


def library() -> ctypes.CDLL | None:
    return kernels().library()


def runs_on(x: Tensor) -> bool:
    """Whether the shared native kernels can take ``x`` and the fast paths in force allow them."""
    return current().native and kernels().runs_on(x)


def forward(kind: str, x: Tensor, alpha: Tensor | float | None = None,
            max_passes: int | None = None) -> tuple[Tensor, Tensor]:
    return kernels().forward(kind, x, alpha, max_passes)


def backward(kind: str, grad: Tensor, y: Tensor, alpha: Tensor | float | None = None,
             alpha_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    return kernels().backward(kind, grad, y, alpha, alpha_grad)


def softmax_locality(q: Tensor, k: Tensor, scale: float, distances: Tensor, prefix: int) -> Tensor:
    """See ``NativeKernels.softmax_locality``."""
    return kernels().softmax_locality(q, k, scale, distances, prefix)


def _strided_rows(x: Tensor) -> Tensor:
    """x in float32 with a contiguous last dim, without a copy where it already is."""
    x = x.detach().to(torch.float32)
    return x if x.stride(-1) == 1 else x.contiguous()


def _kernel_input(x: Tensor) -> Tensor:
    """x as the kernels read it: float32 or bfloat16 (read as is), contiguous."""
    x = x.detach()
    return (x if x.dtype in _DTYPES else x.to(torch.float32)).contiguous()


class RowAlphas(NamedTuple):
    """The kernels' alphas: row r's alpha is values[r // inner % period] (float32, contiguous); ``per_row``: one
    value per row, where the alpha given did not map onto the rows that way (then its gradient is summed here)."""

    values: Tensor | None
    inner: int
    period: int
    per_row: bool = False


def _row_alphas(alpha: Tensor | float | None, rows_shape: torch.Size, collapse_expanded: bool = True) -> RowAlphas:
    """``alpha`` (broadcastable to ``rows_shape``, or to it + (1,)) as the kernels read it: its own values where
    the dims along which it varies are one run of ``rows_shape``'s (one value for all rows; one per head of
    (batch, heads, queries) rows), else one per row. With ``collapse_expanded``, dims of a tensor expanded from
    fewer values (stride 0) count as not varying: no per-row copy of an expanded alpha."""
    if alpha is None:
        raise ValueError("kind 'alpha' needs alpha: a float or one value per row")
    alpha = torch.as_tensor(alpha, dtype=torch.float32).detach()
    if alpha.dim() == len(rows_shape) + 1 and alpha.shape[-1] == 1:
        alpha = alpha[..., 0]
    alpha.expand(rows_shape)  # raises where alpha does not broadcast to the rows
    alpha = alpha[(None,) * (len(rows_shape) - alpha.dim())]
    if collapse_expanded:
        alpha = alpha[tuple(slice(0, 1) if step == 0 else slice(None) for step in alpha.stride())]
    varying = [d for d, size in enumerate(alpha.shape) if size > 1]
    if not varying:
        return RowAlphas(alpha.reshape(1), 1, 1)
    first, last = varying[0], varying[-1]
    if alpha.shape[first:last + 1] == rows_shape[first:last + 1]:
        return RowAlphas(alpha.reshape(-1).contiguous(), math.prod(rows_shape[last + 1:]),
                         math.prod(rows_shape[first:last + 1]))
    return RowAlphas(alpha.expand(rows_shape).reshape(-1).contiguous(), 1, math.prod(rows_shape), per_row=True)


def _pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(status: int) -> None:
    if status == -3:
        raise RuntimeError("native kernel could not allocate its work buffer (out of memory)")
    if status != 0:  # kinds.def and the built library disagree: a stale build
        raise RuntimeError(f"native kernel returned {status}: delete {cache_dir()} to rebuild")


def _threads(x: Tensor) -> int:
    return max(1, min(torch.get_num_threads(), x.numel() // _MIN_ELEMENTS_PER_THREAD))
