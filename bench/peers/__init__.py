"""The peers, each at its best: PyTorch eager (cudnn.benchmark on), fused library ops through PyTorch
(torch.cudnn_convolution_relu / _add_relu, torch._addmm_activation), torch.compile (max-autotune,
freezing for inference) and the cuDNN frontend (its heuristic-A plan, and autotuned over all plans)."""
