"""The spec: every layer of a decoder-only transformer in plain NumPy.

One concept per module, no state, no refllm imports beyond ``config``.
Shapes use one legend throughout refllm:

    B batch   T tokens in this step   S keys in the cache   D hidden size
    H query heads   K KV heads   E head dim   R rotary dims (<= E)
    F MLP size   V vocabulary   (and in the paged arena: N blocks of Z token slots)

Every function computes in the dtype of its array arguments: float32 for the
laptop path, float64 for ground truth. Scalars (eps, scales, soft-caps) are
Python floats, which NumPy applies in the array's precision, so one line of
code serves both.
"""
