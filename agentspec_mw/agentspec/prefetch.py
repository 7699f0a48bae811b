"""A cache-line prefetch usable from numba kernels (LLVM's ``llvm.prefetch``).

The index's hash table is far larger than the caches, so each probe of a bucket is a
memory miss (~150 ns on the development VM). A kernel that knows the buckets of a whole
batch ahead prefetches them first, so the misses overlap instead of queuing one by one.
A prefetch never faults and has no effect on results.
"""

from __future__ import annotations

from typing import Any

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch2"]

# opaque pointers from LLVM 15 on: the intrinsic's name mangles the pointer type
_NAME = "llvm.prefetch.p0" if llvm.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def prefetch2(typingctx: Any, arr: Any, i: Any, j: Any) -> Any:  # pragma: no cover
    """Prefetch the cache line of ``arr[i, j]`` (a 2-D array) for reading and writing."""
    sig = types.void(arr, i, j)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, aryty, ary, [args[1], args[2]], wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _NAME)
        # rw = 1 (write), locality = 3 (keep in all levels), cache type = 1 (data)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
