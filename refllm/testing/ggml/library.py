"""The installed llama.cpp library's CPU kernels, called through ctypes (llama-cpp-python ships them).

ggml gives each tensor type a CPU ``from_float`` (the quantizer its matrix products apply to float
activations) and a ``vec_dot`` (the dot product of one weight row with one quantized activation row), in
``ggml_get_type_traits_cpu(type)``. ``GgmlLibrary`` calls both on NumPy bytes, so the specs of
``quantizers.py`` and ``dots.py`` can be compared with them bit for bit, and says which build it is: the
package's version and the instruction sets ggml was compiled for (``isa``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from refllm.testing.ggml.blocks import BLOCKS, TYPE_IDS, type_name

_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# void vec_dot(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)  # fmt: skip


class _TypeTraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]  # fmt: skip


# the instruction sets the report names, as ggml_cpu_has_<name> says ggml was compiled for them
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "llamafile")


class GgmlLibrary:
    """ggml's CPU quantizers and dot products, from the shared library at ``lib_dir``."""

    def __init__(self, lib_dir: str | Path, version: str):
        self.version = version
        self._cpu = ctypes.CDLL(str(next(Path(lib_dir).glob("libggml-cpu.*"))))
        self.base = ctypes.CDLL(str(next(Path(lib_dir).glob("libggml-base.*"))))
        self.base.ggml_op_name.restype = ctypes.c_char_p
        self.base.ggml_backend_buffer_name.restype = ctypes.c_char_p
        self.base.ggml_backend_buffer_name.argtypes = [ctypes.c_void_p]
        self._cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCpu)
        self._cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self._cpu.ggml_cpu_init()  # fills the float16 tables the kernels read

    def isa(self) -> dict[str, bool]:
        return {flag: bool(getattr(self._cpu, f"ggml_cpu_has_{flag}")()) for flag in ISA_FLAGS}

    def build(self) -> str:
        """One line: the version and the instruction sets compiled in."""
        return f"llama-cpp-python {self.version}, " + " ".join(f for f, on in self.isa().items() if on)

    def _traits(self, name: str) -> _TypeTraitsCpu:
        return self._cpu.ggml_get_type_traits_cpu(TYPE_IDS[name]).contents

    def vec_dot_type(self, name: str) -> str:
        """The type a ``name`` weight's activations are quantized to before its dot products."""
        return type_name(self._traits(name).vec_dot_type)

    def quantize(self, name: str, x: np.ndarray) -> np.ndarray:
        """``name``'s CPU quantizer on a row: [n] float32 -> [n / B * type_size] uint8 (its blocks' bytes)."""
        x = np.ascontiguousarray(x, np.float32)
        block = BLOCKS[name]
        out = np.zeros(x.size // block.size * block.type_size, np.uint8)
        _FROM_FLOAT(self._traits(name).from_float)(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def dot(self, name: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
        """``vec_dot`` of each weight row with one quantized activation row: [R, nb * type_size] uint8 (rows of
        ``name`` blocks) and [nb * type_size'] (blocks of its vec_dot type) -> [R] float32."""
        weights = np.ascontiguousarray(weights, np.uint8)
        activations = np.ascontiguousarray(activations, np.uint8)
        n = weights.shape[1] // BLOCKS[name].type_size * BLOCKS[name].size
        kernel = _VEC_DOT(self._traits(name).vec_dot)
        out = np.zeros(len(weights), np.float32)
        for r, row in enumerate(weights):
            kernel(n, out[r:].ctypes.data, 0, row.ctypes.data, 0, activations.ctypes.data, 0, 1)
        return out


def installed_library() -> GgmlLibrary | None:
    """The library llama-cpp-python loads, or None where the package is absent."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return GgmlLibrary(Path(llama_cpp.__file__).parent / "lib", llama_cpp.__version__)
