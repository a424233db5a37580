"""Integer dot products of bytes, for the int8-activation products (``int8_matmul.py``): 64 bytes
a step, in the instructions the CPU has.

The one operation: ``dot_u8s8(u, s, acc, isa)``, 16 int32 lanes, lane i = acc[i] + the sum of
u[4i + k] * s[4i + k] over k < 4, u read as unsigned bytes, s as signed. Exact: integer
arithmetic, no rounding, the same result from every instruction set below, provided
u <= 128 and |s| <= 127 (``vpmaddubsw`` adds two products into a saturating int16:
2 x 128 x 127 = 32512 fits). The callers keep to that: 4-bit weights are 0..15, an int8
weight w enters as |w| and multiplies sign(w) s, and activations are quantized to -127..127.

``isa`` picks the instructions (a compile-time constant; ``HOST_ISA`` is this CPU's best):

    VNNI512   vpdpbusd on zmm registers (AVX-512 VNNI): 64 multiply-adds in one instruction
    VNNI256   vpdpbusd twice on ymm (AVX-VNNI, CPUs with VNNI but no AVX-512)
    MADD512   vpmaddubsw then vpmaddwd against ones (AVX-512 BW)
    MADD256   the same twice on ymm (AVX2)
    GENERIC   widened to int32, multiplied, groups of four added: any CPU LLVM targets

LLVM does not turn a plain integer loop into ``vpdpbusd`` by itself, so these are its x86
intrinsics, emitted through ``numba.extending.intrinsic`` as ``intrinsics.py`` emits its prefetch.
The host's features come from LLVM (``llvmlite.binding.get_host_cpu_features``) when this
module is imported; Numba compiles for the host and keys its cache to the CPU, so a kernel
compiled here with VNNI is never loaded on a CPU without it.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from refllm.kernels.intrinsics import element_address, float32x16, vector_load

VNNI512, VNNI256, MADD512, MADD256, GENERIC = range(5)
ISA_NAMES = (
    "vpdpbusd (AVX-512 VNNI)", "vpdpbusd (AVX-VNNI)", "vpmaddubsw (AVX-512 BW)", "vpmaddubsw (AVX2)", "generic"
)


def host_isa(features: dict[str, bool] | None = None) -> int:
    """The best of the instruction sets above that this CPU (or ``features``, LLVM's names) has."""
    have = llvm.get_host_cpu_features() if features is None else features
    if have.get("avx512vnni") and have.get("avx512bw"):
        return VNNI512
    if have.get("avxvnni"):
        return VNNI256
    if have.get("avx512bw"):
        return MADD512
    if have.get("avx2"):
        return MADD256
    return GENERIC


HOST_ISA = host_isa()

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_BYTES64 = ir.VectorType(_I8, 64)
_INTS16 = ir.VectorType(_I32, 16)


class Bytes64(types.Type):
    """64 bytes, an LLVM <64 x i8>."""

    def __init__(self):
        super().__init__(name="bytes64")


class Int32x16(types.Type):
    """16 int32 lanes, an LLVM <16 x i32>."""

    def __init__(self):
        super().__init__(name="int32x16")


bytes64, int32x16 = Bytes64(), Int32x16()


@register_model(Bytes64)
class _BytesModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _BYTES64)


@register_model(Int32x16)
class _IntsModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _INTS16)


def _byte_array(array) -> bool:
    return isinstance(array, types.Array) and array.dtype in (types.uint8, types.int8) and array.layout == "C"


def _indices(values) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), list(values))


def _load(context, builder, signature, args, which: int, vector: ir.VectorType):
    return builder.load(element_address(context, builder, signature.args[0], args[0], args[which], vector), align=1)


@intrinsic
def load_bytes64(typingctx, array, index):
    """Bytes index .. index + 63 of a contiguous uint8 or int8 array, counted from its start."""
    if not _byte_array(array):
        return None

    def codegen(context, builder, signature, args):
        return _load(context, builder, signature, args, 1, _BYTES64)

    return bytes64(array, index), codegen


@intrinsic
def byte_pair64(typingctx, row, first, second):
    """Bytes first .. first + 31, then second .. second + 31, of a contiguous byte row: two blocks' int8s."""
    if not _byte_array(row):
        return None

    def codegen(context, builder, signature, args):
        half = ir.VectorType(_I8, 32)
        low = _load(context, builder, signature, args, 1, half)
        high = _load(context, builder, signature, args, 2, half)
        return builder.shuffle_vector(low, high, _indices(range(64)))

    return bytes64(row, first, second), codegen


@intrinsic
def nibble_pair64(typingctx, row, first, second):
    """The 16 bytes at ``first`` and the 16 at ``second`` of a byte row, split into nibbles: the low
    nibbles of the first, its high nibbles, then the same of the second (two 4-bit blocks' 32 values
    each, in their weights' order)."""
    if not _byte_array(row):
        return None

    def codegen(context, builder, signature, args):
        quarter = ir.VectorType(_I8, 16)
        fifteen, four = ir.Constant(quarter, [15] * 16), ir.Constant(quarter, [4] * 16)
        halves = []
        for which in (1, 2):
            packed = _load(context, builder, signature, args, which, quarter)
            low, high = builder.and_(packed, fifteen), builder.lshr(packed, four)
            halves.append(builder.shuffle_vector(low, high, _indices(range(32))))
        return builder.shuffle_vector(halves[0], halves[1], _indices(range(64)))

    return bytes64(row, first, second), codegen


@intrinsic
def abs_bytes64(typingctx, w):
    """|w| of 64 int8 (|-128| = 128, read as an unsigned byte)."""
    if w != bytes64:
        return None

    def codegen(context, builder, signature, args):
        negative = builder.icmp_signed("<", args[0], ir.Constant(_BYTES64, [0] * 64))
        return builder.select(negative, builder.neg(args[0]), args[0])

    return bytes64(w), codegen


@intrinsic
def signed_by64(typingctx, s, w):
    """s where w >= 0, -s where w < 0, lane by lane (64 int8; the callers keep s in -127..127)."""
    if not (s == w == bytes64):
        return None

    def codegen(context, builder, signature, args):
        negative = builder.icmp_signed("<", args[1], ir.Constant(_BYTES64, [0] * 64))
        return builder.select(negative, builder.neg(args[0]), args[0])

    return bytes64(s, w), codegen


def _call(builder, name: str, result: ir.Type, arguments: list) -> ir.Value:
    signature = ir.FunctionType(result, [argument.type for argument in arguments])
    function = cgutils.get_or_insert_function(builder.module, signature, name)
    return builder.call(function, arguments)


def _halves(builder, vector: ir.Value, lanes: int) -> tuple[ir.Value, ir.Value]:
    return (builder.shuffle_vector(vector, vector, _indices(range(0, lanes // 2))),
            builder.shuffle_vector(vector, vector, _indices(range(lanes // 2, lanes))))  # fmt: skip


def _madd(builder, u, s, width: int) -> ir.Value:
    """vpmaddubsw then vpmaddwd against ones: u s summed in fours, int32 lanes, one register of ``width`` bits."""
    n = width // 8
    if width == 512:
        pairs = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", ir.VectorType(_I16, 32), [u, s])
        return _call(builder, "llvm.x86.avx512.pmaddw.d.512", _INTS16, [pairs, ir.Constant(pairs.type, [1] * 32)])
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(_I16, n // 2), [u, s])
    ones = ir.Constant(pairs.type, [1] * (n // 2))
    return _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(_I32, n // 4), [pairs, ones])


def _dot(builder, isa: int, u, s, acc) -> ir.Value:
    as_ints = ir.VectorType(_I32, 16)
    if isa == VNNI512:
        operands = [acc, builder.bitcast(u, as_ints), builder.bitcast(s, as_ints)]
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", _INTS16, operands)
    if isa == VNNI256:
        parts = []
        halves = zip(_halves(builder, u, 64), _halves(builder, s, 64), _halves(builder, acc, 16))
        for u_half, s_half, acc_half in halves:
            eight = ir.VectorType(_I32, 8)
            parts.append(_call(builder, "llvm.x86.avx512.vpdpbusd.256", eight,
                               [acc_half, builder.bitcast(u_half, eight), builder.bitcast(s_half, eight)]))  # fmt: skip
        return builder.shuffle_vector(parts[0], parts[1], _indices(range(16)))
    if isa == MADD512:
        return builder.add(acc, _madd(builder, u, s, 512))
    if isa == MADD256:
        low, high = (_madd(builder, a, b, 256) for a, b in zip(_halves(builder, u, 64), _halves(builder, s, 64)))
        return builder.add(acc, builder.shuffle_vector(low, high, _indices(range(16))))
    products = builder.mul(builder.zext(u, ir.VectorType(_I32, 64)), builder.sext(s, ir.VectorType(_I32, 64)))
    for k in range(4):
        acc = builder.add(acc, builder.shuffle_vector(products, products, _indices(range(k, 64, 4))))
    return acc


@intrinsic
def dot_u8s8(typingctx, u, s, acc, isa):
    """acc + the sums of u s in groups of four bytes, 16 int32 lanes (the module's docstring has the bounds);
    ``isa`` a compile-time constant of this module (VNNI512 .. GENERIC)."""
    if not (u == s == bytes64 and acc == int32x16 and isinstance(isa, types.IntegerLiteral)):
        return None
    chosen = isa.literal_value

    def codegen(context, builder, signature, args):
        return _dot(builder, chosen, args[0], args[1], args[2])

    return int32x16(u, s, acc, isa), codegen


@intrinsic
def zeros_int32x16(typingctx):
    """16 int32 lanes of 0."""

    def codegen(context, builder, signature, args):
        return ir.Constant(_INTS16, [0] * 16)

    return int32x16(), codegen


load_int32x16 = vector_load(types.int32, _INTS16, int32x16)
load_int32x16.__doc__ = "Elements index .. index + 15 of a C-contiguous int32 array, counted from its start."


@intrinsic
def float32x16_of(typingctx, lanes):
    """16 int32 lanes as float32 (exact below 2^24, which every lane sum of one block pair is)."""
    if lanes != int32x16:
        return None

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], ir.VectorType(ir.FloatType(), 16))

    return float32x16(lanes), codegen


@intrinsic
def half_pair16(typingctx, row, first, second, scale_first, scale_second):
    """16 float32 lanes: the float16 at byte ``first`` of a byte row times ``scale_first`` in lanes 0-7,
    the one at ``second`` times ``scale_second`` in lanes 8-15 (a block pair's scales; the conversion
    is exact, and ``vcvtph2ps`` where the CPU has F16C)."""
    if not (_byte_array(row) and scale_first == scale_second == types.float32):
        return None

    def codegen(context, builder, signature, args):
        halves = ir.Constant(ir.VectorType(ir.HalfType(), 2), ir.Undefined)
        scales = ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined)
        for lane, (at, scale) in enumerate(((args[1], args[3]), (args[2], args[4]))):
            address = element_address(context, builder, signature.args[0], args[0], at, ir.HalfType())
            value = builder.load(address, align=1)
            halves = builder.insert_element(halves, value, _I32(lane))
            scales = builder.insert_element(scales, scale, _I32(lane))
        pair = builder.fmul(builder.fpext(halves, ir.VectorType(ir.FloatType(), 2)), scales)
        return builder.shuffle_vector(pair, pair, _indices([0] * 8 + [1] * 8))

    return float32x16(row, first, second, scale_first, scale_second), codegen


@intrinsic
def pair16(typingctx, first, second):
    """16 float32 lanes: ``first`` in lanes 0-7, ``second`` in lanes 8-15 (one value per block of a pair)."""
    if not (first == second == types.float32):
        return None

    def codegen(context, builder, signature, args):
        pair = ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined)
        pair = builder.insert_element(builder.insert_element(pair, args[0], _I32(0)), args[1], _I32(1))
        return builder.shuffle_vector(pair, pair, _indices([0] * 8 + [1] * 8))

    return float32x16(first, second), codegen
