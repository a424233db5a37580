"""What the Numba kernels share below the level of NumPy: the fast-math flags of their sums, and
two machine-level operations Numba has no spelling for (a software prefetch, and reading an
int32's bits as a float32)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# Fast-math flags for the kernels' sums, and only these two: "reassoc" lets LLVM keep vector
# partial sums (a float sum is otherwise one serial chain, which stays scalar) and add the lanes up
# at the end; "contract" lets it fuse multiply and add. Both change only the order a sum is
# rounded in: no approximate functions, and infinities and NaNs still propagate as IEEE says.
SUM_FASTMATH = {"reassoc", "contract"}


@intrinsic
def prefetch(typingctx, array, index):
    """Hint the CPU to fetch the cache line of element ``index`` of a contiguous array, counted
    from its start whatever its dimensions, for reading (LLVM's llvm.prefetch: read, keep in all
    cache levels, data cache). A hint: an address past the array's end is not an error."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_pointer = ir.IntType(8).as_pointer()
        int32 = ir.IntType(32)
        hint = ir.FunctionType(ir.VoidType(), [byte_pointer, int32, int32, int32])
        llvm_prefetch = builder.module.declare_intrinsic("llvm.prefetch", [byte_pointer], hint)
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_pointer)
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
