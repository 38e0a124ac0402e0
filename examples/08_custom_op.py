"""A custom op: registered once with its shape rule and reference (and optionally device and Triton
implementations), then used in graphs, files and plans like a built-in op."""

import numpy as np

import opgraph as og


def swiglu(x, gate, beta=1.0):  # the reference: float64 NumPy in and out
    return x * gate / (1.0 + np.exp(-beta * gate))


og.register_custom_op("swiglu", num_inputs=2, reference=swiglu, pointwise=True)

g = og.Graph("ffn", io_data_type=og.DataType.FLOAT)
x = g.tensor(dim=[4, 16], name="x")
gate = g.tensor(dim=[4, 16], name="gate")
y = g.custom("swiglu", x, gate, params={"beta": 1.5})
g.add(y, 1.0).set_output(True).set_name("out")
print(g)

plan = g.build(device="cpu")
rng = np.random.default_rng(4)
pack = og.testing.random_pack(g.final, rng)
plan.execute(pack)
want = swiglu(pack[x.uid].astype(np.float64), pack[gate.uid].astype(np.float64), 1.5) + 1.0
out = pack[g.final.tensor("out").uid]
print("custom op result matches NumPy" if np.allclose(out, want, rtol=1e-5) else "MISMATCH")
print("round-trips through JSON:", og.Graph.from_json(g.to_json()).key() == g.key())

# With an @triton.jit elementwise function (at a module's top level), the op is fused into generated
# kernels like a built-in mode: here swiglu and the "+ 1" run as one kernel. (On a machine without a
# GPU, Triton's interpreter runs it; nothing needs to be set.)
device = og.core.device.resolve_device("cuda" if og.core.device.cuda_usable() else "cpu")
if og.engines.get_engine("triton").available(device).ok:
    import triton
    import triton.language as tl

    @triton.jit
    def swiglu_tl(x, gate, beta):
        return x * gate / (1.0 + tl.exp(-beta * gate))

    # the same name again: replace=True says so (another definition without it is a RegistrationError)
    og.register_custom_op("swiglu", num_inputs=2, reference=swiglu, triton=swiglu_tl, pointwise=True, replace=True)
    fused = og.Graph.from_json(g.to_json()).build(device=device, engines=["triton"])
    print(f"\nfused: {len(fused.steps)} kernel, template {fused.steps[0].config.knob('template')}")
    print("\n".join(line for line in fused.source(0).splitlines() if "_og_custom_swiglu" in line))
    bad = og.testing.check_plan(fused, rng)
    print("fused kernel matches the reference" if not bad else f"MISMATCH: {bad}")
