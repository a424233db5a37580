"""What the Numba kernels share below the level of NumPy: the fast-math flags of their sums, and
machine-level operations Numba has no spelling for: a software prefetch, reading an int32's bits
as a float32, and 16-lane float32 vectors whose sums round the same way in every loop."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

# Fast-math flags for the kernels' sums, and only these two: "reassoc" lets LLVM keep vector
# partial sums (a float sum is otherwise one serial chain, which stays scalar) and add the lanes up
# at the end; "contract" lets it fuse multiply and add. Both change only the order a sum is
# rounded in: no approximate functions, and infinities and NaNs still propagate as IEEE says.
SUM_FASTMATH = {"reassoc", "contract"}


def element_address(context, builder, array_type, array, index, pointee: ir.Type):
    """A pointer to element ``index`` of a contiguous array, counted from its start, as ``pointee``*."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), pointee.as_pointer())


CACHE_LINE = 64  # bytes, on every x86-64 (what one prefetch fetches)


@intrinsic
def prefetch(typingctx, array, index):
    """Hint the CPU to fetch the cache line of element ``index`` of a contiguous array, counted
    from its start whatever its dimensions, for reading (LLVM's llvm.prefetch: read, keep in all
    cache levels, data cache). A hint: an address past the array's end is not an error."""

    def codegen(context, builder, signature, args):
        address = element_address(context, builder, signature.args[0], args[0], args[1], ir.IntType(8))
        int32 = ir.IntType(32)
        hint = ir.FunctionType(ir.VoidType(), [address.type, int32, int32, int32])
        llvm_prefetch = builder.module.declare_intrinsic("llvm.prefetch", [address.type], hint)
        builder.call(llvm_prefetch, [address, int32(0), int32(3), int32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@intrinsic
def float32_from_bits(typingctx, bits):
    """The float32 whose IEEE 754 bit pattern is the int32 ``bits`` (a reinterpretation, no
    conversion): ``(e + 127) << 23`` is 2.0 ** e. Compiles to no instruction, so loops using
    it still vectorise."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


# ---- 16 float32 lanes, summed in an order fixed by the code ----------------------------------------
# With "reassoc", LLVM picks how many partial sums a loop keeps, per loop: the same dot product then
# rounds differently in a one-token loop and a four-token loop. These operations spell the vector
# out instead, so every loop that uses them sums a dot product the same way: lane l adds the
# products of columns l, l + 16, l + 32, ... in order, then ``sum16`` adds the lanes in a fixed tree.

LANES = 16
_LANE_VECTOR = ir.VectorType(ir.FloatType(), LANES)


class Float32x16(types.Type):
    """The Numba type of 16 float32 lanes, an LLVM <16 x float> (two registers where a register
    holds 8)."""

    def __init__(self):
        super().__init__(name="float32x16")


float32x16 = Float32x16()


@register_model(Float32x16)
class _LaneVectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _LANE_VECTOR)


@intrinsic
def zeros16(typingctx):
    """16 lanes of +0.0."""

    def codegen(context, builder, signature, args):
        return ir.Constant(_LANE_VECTOR, [0.0] * LANES)

    return float32x16(), codegen


def vector_load(dtype, vector: ir.VectorType, result):
    """-> an intrinsic ``load(array, index)``: the elements index .. of a C-contiguous array of ``dtype``
    that fill ``vector``, counted from the array's start whatever its dimensions, as ``result``."""

    @intrinsic
    def load(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == dtype and array.layout == "C"):
            return None

        def codegen(context, builder, signature, args):
            address = element_address(context, builder, signature.args[0], args[0], args[1], vector)
            return builder.load(address, align=dtype.bitwidth // 8)

        return result(array, index), codegen

    return load


load16 = vector_load(types.float32, _LANE_VECTOR, float32x16)
load16.__doc__ = "Elements index .. index + 15 of a C-contiguous float32 array; the caller keeps index + 15 inside it."


@intrinsic
def multiply_add16(typingctx, a, b, c):
    """a * b + c lane by lane (llvm.fmuladd: one fused multiply-add where the machine has one, as
    on every x86-64 with AVX2; a multiply then an add elsewhere, the same way in every loop)."""
    if not (a == b == c == float32x16):
        return None

    def codegen(context, builder, signature, args):
        signature_ir = ir.FunctionType(_LANE_VECTOR, [_LANE_VECTOR] * 3)
        fmuladd = cgutils.get_or_insert_function(builder.module, signature_ir, f"llvm.fmuladd.v{LANES}f32")
        return builder.call(fmuladd, list(args))

    return float32x16(a, b, c), codegen


def _lane_indices(first: int, count: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), count), list(range(first, first + count)))


@intrinsic
def sum16(typingctx, lanes):
    """The sum of the 16 lanes: halves added lane by lane (8, then 4, 2, 1), each add rounded."""
    if lanes != float32x16:
        return None

    def codegen(context, builder, signature, args):
        vector, width = args[0], LANES
        while width > 1:
            width //= 2
            low = builder.shuffle_vector(vector, vector, _lane_indices(0, width))
            high = builder.shuffle_vector(vector, vector, _lane_indices(width, width))
            vector = builder.fadd(low, high)
        return builder.extract_element(vector, ir.IntType(32)(0))

    return types.float32(lanes), codegen


def _splat(builder, value):
    """A float32 or an int32 in all 16 lanes."""
    empty = ir.Constant(ir.VectorType(value.type, LANES), ir.Undefined)
    lanes = builder.insert_element(empty, value, ir.IntType(32)(0))
    return builder.shuffle_vector(lanes, lanes, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


@intrinsic
def broadcast16(typingctx, value):
    """16 lanes of one float32."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, args[0])

    return float32x16(value), codegen


def _lanewise(operation: str):
    @intrinsic
    def lanewise(typingctx, a, b):
        if not (a == b == float32x16):
            return None

        def codegen(context, builder, signature, args):
            return getattr(builder, operation)(args[0], args[1])

        return float32x16(a, b), codegen

    return lanewise


add16 = _lanewise("fadd")
add16.__doc__ = "a + b lane by lane."
mul16 = _lanewise("fmul")
mul16.__doc__ = "a * b lane by lane."


# ---- 16 integers of a uint8 array (a quantized row's bytes), as float32 lanes ------------------------

_BYTES = ir.VectorType(ir.IntType(8), LANES)
_INTS = ir.VectorType(ir.IntType(32), LANES)


def _bytes_at(context, builder, signature, args):
    return builder.load(element_address(context, builder, signature.args[0], args[0], args[1], _BYTES), align=1)


def _is_byte_row(array) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.uint8 and array.ndim == 1 and array.layout == "C"


def _int32(builder, value):
    """An LLVM integer cut or zero-extended to 32 bits."""
    if value.type.width > 32:
        return builder.trunc(value, ir.IntType(32))
    return builder.zext(value, ir.IntType(32)) if value.type.width < 32 else value


@intrinsic
def byte_bits16(typingctx, row, index, shift, mask):
    """(byte >> shift) & mask for bytes index .. index + 15 of a contiguous uint8 row, as 16 float32
    lanes: a nibble (shift 0 or 4, mask 15), a 2-bit field (mask 3), a single bit (mask 1)."""
    if not (_is_byte_row(row) and isinstance(shift, types.Integer) and isinstance(mask, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        ints = builder.zext(_bytes_at(context, builder, signature, args), _INTS)
        shifted = builder.lshr(ints, _splat(builder, _int32(builder, args[2])))
        return builder.uitofp(builder.and_(shifted, _splat(builder, _int32(builder, args[3]))), _LANE_VECTOR)

    return float32x16(row, index, shift, mask), codegen


@intrinsic
def int8s16(typingctx, row, index):
    """Bytes index .. index + 15 of a contiguous uint8 row read as int8, as 16 float32 lanes."""
    if not _is_byte_row(row):
        return None

    def codegen(context, builder, signature, args):
        return builder.sitofp(builder.sext(_bytes_at(context, builder, signature, args), _INTS), _LANE_VECTOR)

    return float32x16(row, index), codegen


@intrinsic
def bits16(typingctx, value, first):
    """Bits first .. first + 15 of an integer (lane j holds bit first + j), as 16 float32 lanes of
    0.0 or 1.0. ``first`` is 0 or 16: a 32-bit mask's two halves."""
    if not (isinstance(value, types.Integer) and isinstance(first, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        lanes = _splat(builder, builder.lshr(_int32(builder, args[0]), _int32(builder, args[1])))
        bits = builder.lshr(lanes, ir.Constant(_INTS, list(range(LANES))))
        return builder.uitofp(builder.and_(bits, ir.Constant(_INTS, [1] * LANES)), _LANE_VECTOR)

    return float32x16(value, first), codegen
