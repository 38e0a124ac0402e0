"""What several engines share, owned by none of them (tests/test_layers.py: engines never import each
other; they and the build import from here):

    views        operands read in place through slices, transposes and reshapes (`View`), attention's
                 operand views and gradient targets (the generated kernels and cuDNN's attention)
    conv_shapes  a convolution's shape facts and the channel thresholds that generated kernels,
                 cuDNN's lowering and the build's ranking policy read alike
    evaluate     one node evaluated by its op's reference definition (the reference engine, and the
                 torch engine for ops it has no mapping of)
"""
