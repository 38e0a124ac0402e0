"""A cuDNN frontend program, run by changing its import: `import opgraph.cudnn as cudnn`.

The flow is cuDNN's, call for call: a conv + bias + relu graph, then a training batchnorm whose running
statistics are updated in place (the output bound to the input's buffer, as cuDNN programs do), then
the plan serialized and loaded into a fresh graph and executed by UID. On a machine without a GPU
the tensors are CPU tensors and the plans run on the reference engine; with one, they are CUDA
tensors. Each step prints what it did.
"""

from __future__ import annotations

import torch

from opgraph import cudnn  # was: import cudnn

device = "cuda" if torch.cuda.is_available() else "cpu"
handle = cudnn.create_handle()
print(f"1. handle on {handle.device}; tensors on {device}")

# -- conv + bias + relu, as test_conv_bias.py writes it -------------------------------------------------
torch.manual_seed(0)
x_gpu = torch.randn(4, 16, 20, 20, device=device, dtype=torch.float16).to(memory_format=torch.channels_last)
w_gpu = torch.randn(32, 16, 3, 3, device=device, dtype=torch.float16).to(memory_format=torch.channels_last)
b_gpu = torch.randn(1, 32, 1, 1, device=device, dtype=torch.float16).to(memory_format=torch.channels_last)

graph = cudnn.pygraph(
    io_data_type=cudnn.data_type.HALF,
    intermediate_data_type=cudnn.data_type.FLOAT,
    compute_data_type=cudnn.data_type.FLOAT,
    handle=handle,
)
X = graph.tensor(name="X", dim=x_gpu.size(), stride=x_gpu.stride(), data_type=x_gpu.dtype)
W = graph.tensor(name="W", dim=w_gpu.size(), stride=w_gpu.stride(), data_type=w_gpu.dtype)
B = graph.tensor(name="B", dim=b_gpu.size(), stride=b_gpu.stride(), data_type=b_gpu.dtype)
conv = graph.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
Y = graph.relu(name="relu", input=graph.bias(name="bias", input=conv, bias=B))
Y.set_output(True)

graph.validate()
graph.build_operation_graph()
graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
graph.check_support()
graph.build_plans()
print(
    f"2. graph validated and built: {graph.get_execution_plan_count()} plan candidate(s); "
    f"plan 0 = {graph.get_plan_name_at_index(0)}; notes {[n.name for n in graph.get_behavior_notes()]}"
)

workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
y_gpu = torch.empty(4, 32, 20, 20, device=device, dtype=torch.float16).to(memory_format=torch.channels_last)
graph.execute({X: x_gpu, W: w_gpu, B: b_gpu, Y: y_gpu}, workspace, handle=handle)
ref = torch.relu(torch.nn.functional.conv2d(x_gpu.float(), w_gpu.float(), b_gpu.float().reshape(-1), padding=1))
err = ((y_gpu.float() - ref).abs() / (1 + ref.abs())).max().item()
print(f"3. executed; max |Y - PyTorch| / (1 + |Y|) = {err:.3g} (fp16 output)")
assert err < 1e-2, "MISMATCH"

# -- batchnorm with the running statistics updated in place -----------------------------------------------
bn = cudnn.pygraph(
    io_data_type=cudnn.data_type.HALF,
    intermediate_data_type=cudnn.data_type.FLOAT,
    compute_data_type=cudnn.data_type.FLOAT,
    handle=handle,
)
scale_gpu = torch.randn(1, 32, 1, 1, device=device)
bias_gpu = torch.randn(1, 32, 1, 1, device=device)
running_mean = torch.randn(1, 32, 1, 1, device=device)
running_var = torch.rand(1, 32, 1, 1, device=device) + 0.5
expected_mean = 0.9 * running_mean + 0.1 * y_gpu.float().mean(dim=(0, 2, 3), keepdim=True)
x = bn.tensor_like(y_gpu)
scale, bias = bn.tensor_like(scale_gpu), bn.tensor_like(bias_gpu)
in_mean, in_var = bn.tensor_like(running_mean), bn.tensor_like(running_var)
epsilon, momentum = bn.tensor_like(torch.full((1, 1, 1, 1), 1e-5)), bn.tensor_like(torch.full((1, 1, 1, 1), 0.1))
out, saved_mean, saved_inv_var, out_mean, out_var = bn.batchnorm(
    name="BN",
    input=x,
    scale=scale,
    bias=bias,
    in_running_mean=in_mean,
    in_running_var=in_var,
    epsilon=epsilon,
    momentum=momentum,
)
out.set_output(True)
for t in (saved_mean, saved_inv_var, out_mean, out_var):
    t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
bn.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
out_gpu = torch.empty_like(y_gpu)
saved = [torch.empty_like(scale_gpu) for _ in range(2)]
bn.execute(
    {
        x: y_gpu,
        scale: scale_gpu,
        bias: bias_gpu,
        in_mean: running_mean,
        in_var: running_var,
        epsilon: torch.full((1, 1, 1, 1), 1e-5),
        momentum: torch.full((1, 1, 1, 1), 0.1),
        out: out_gpu,
        saved_mean: saved[0],
        saved_inv_var: saved[1],
        out_mean: running_mean,
        out_var: running_var,
    },  # the outputs over their inputs' buffers
    torch.empty(bn.get_workspace_size(), device=device, dtype=torch.uint8),
    handle=handle,
)
err = (running_mean - expected_mean).abs().max().item()
print(f"4. batchnorm updated its running mean in place: max |mean - expected| = {err:.3g}")
assert err < 1e-4, "MISMATCH"

# -- the plan, serialized and run again by UID -----------------------------------------------------------
data = graph.serialize()
loaded = cudnn.pygraph()
loaded.deserialize(handle, data)
y2 = torch.empty_like(y_gpu)
loaded.execute(
    {X.get_uid(): x_gpu, W.get_uid(): w_gpu, B.get_uid(): b_gpu, Y.get_uid(): y2},
    torch.empty(loaded.get_workspace_size(), device=device, dtype=torch.uint8),
    handle=handle,
)
print(f"5. serialized ({len(data)} bytes), deserialized and executed by UID: same output = {torch.equal(y2, y_gpu)}")
assert torch.equal(y2, y_gpu), "MISMATCH"

# -- what a mistake says -----------------------------------------------------------------------------------
try:
    graph.execute({X: x_gpu, W: w_gpu, Y: y_gpu}, workspace, handle=handle)
except cudnn.cudnnGraphNotSupportedError:
    raise
except RuntimeError as err:  # the cuDNN-style catch still works
    print(f"6. a pack without B is refused ({type(err).__name__}, a RuntimeError):\n   {err}")
