"""@triton.jit elementwise functions of opgraph's own fusable custom ops (see opgraph.losses), imported
by the generated kernels that call them."""

import triton


@triton.jit
def identity(x):
    return x
