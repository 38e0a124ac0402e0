"""Convolutions: conv_fprop, conv_dgrad, conv_wgrad (1-D/2-D/3-D, groups, padding, stride, dilation)."""

from __future__ import annotations

import enum


class ConvolutionMode(enum.Enum):
    CROSS_CORRELATION = "cross_correlation"
    CONVOLUTION = "convolution"  # the filter is flipped in every spatial axis
