"""Train a MobileNet-v1-style network on scikit-learn's digits (1797 8x8 images, 10 classes) to >= 97%
test accuracy, through opgraph: one training-step graph (forward, softmax cross-entropy, backward,
SGD with momentum updating weights and velocities in place, the learning rate a device scalar)
executed batch after batch, and an inference graph (batchnorm with the running statistics) for the
test set.

The network: stem conv3x3 + batchnorm + relu, then depthwise-separable blocks (depthwise 3x3 + bn +
relu, pointwise 1x1 + bn + relu), global average pool, and a linear classifier (a 1x1 conv).
On a GPU the plans use the default engines (generated Triton kernels, PyTorch for the rest); on the
CPU the reference engine runs every op in NumPy: slowly but correctly. Without a GPU the 20 epochs
take about 45 s of CPU time (about 2 s an epoch; a busy machine's wall-clock time is longer). Exits
non-zero below 97%.
"""

import math
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

import opgraph as og
from opgraph.tools.samples import nhwc
from opgraph.training import SGD, softmax_cross_entropy, step_graph

STEM = 16
BLOCKS = [(16, 32, 1), (32, 64, 2), (64, 64, 1)]  # depthwise-separable blocks: (in, out, stride)
CLASSES, BATCH, EPOCHS, EPS = 10, 64, 20, 1e-5
LR, MOMENTUM, WEIGHT_DECAY = 0.2, 0.9, 5e-4  # peak lr of a cosine schedule
FLOAT = og.DataType.FLOAT


def conv_bn_relu(g, h, name, cin, cout, r, stride, training, depthwise=False):
    """conv (depthwise when asked) + batchnorm + relu; parameters are graph inputs named name.*"""
    wdim = [cout, 1 if depthwise else cin, r, r]
    w = g.tensor(dim=wdim, stride=nhwc(wdim), name=f"{name}.w")
    scale, bias, mean, var = (
        g.tensor(dim=[1, cout, 1, 1], name=f"{name}.{p}") for p in ("scale", "bias", "running_mean", "running_var")
    )
    h = g.conv_fprop(h, w, padding=r // 2, stride=stride)
    if training:
        h, m, inv, next_mean, next_var = g.batchnorm(h, scale, bias, mean, var, epsilon=EPS, momentum=0.1)
        m.set_output(True).set_name(f"{name}.batch_mean")  # tiny [1, C, 1, 1] outputs the backward reads
        inv.set_output(True).set_name(f"{name}.batch_inv_variance")
        next_mean.set_output(True).set_name(f"{name}.running_mean@next")
        next_var.set_output(True).set_name(f"{name}.running_var@next")
    else:
        h = g.batchnorm_inference(h, mean, g.rsqrt(g.add(var, EPS)), scale, bias)
    return g.relu(h), [w, scale, bias]


def mobilenet(n, training):
    """The graph (inputs "x", and "onehot" when training), its output (the loss when training, else the
    logits) and its trainable parameters."""
    g = og.Graph("mobilenet_digits" + ("_train" if training else "_eval"), io_data_type=FLOAT)
    x = g.tensor(dim=[n, 1, 8, 8], stride=nhwc([n, 1, 8, 8]), name="x")
    h, params = conv_bn_relu(g, x, "stem", 1, STEM, 3, 1, training)
    for i, (cin, cout, stride) in enumerate(BLOCKS):
        h, p1 = conv_bn_relu(g, h, f"b{i}.dw", cin, cin, 3, stride, training, depthwise=True)
        h, p2 = conv_bn_relu(g, h, f"b{i}.pw", cin, cout, 1, 1, training)
        params += p1 + p2
    c = BLOCKS[-1][1]
    pooled = g.reduction(h, mode="avg").set_dim([n, c, 1, 1])  # global average pool
    fc_w = g.tensor(dim=[CLASSES, c, 1, 1], name="fc.w")
    fc_b = g.tensor(dim=[1, CLASSES, 1, 1], name="fc.b")
    logits = g.bias(g.conv_fprop(pooled, fc_w), fc_b)
    params += [fc_w, fc_b]
    if not training:
        return g, logits.set_output(True).set_name("logits"), params
    onehot = g.tensor(dim=[n, CLASSES, 1, 1], name="onehot")
    return g, softmax_cross_entropy(g, logits, onehot).set_output(True), params


def init_value(desc, rng):
    """Kaiming-normal conv weights, unit batchnorm scales and running variances, zeros elsewhere."""
    arr = og.testing.empty_like_desc(desc)
    name = desc.name
    if name.endswith(".w"):
        fan_in = math.prod(desc.dim[1:])
        arr[...] = rng.normal(0.0, math.sqrt(2.0 / fan_in), desc.dim)
    else:
        arr[...] = 1.0 if name.endswith((".scale", ".running_var")) else 0.0
    return arr


def main():
    # NumPy's BLAS threads gain nothing on these small matrices, and on a busy machine their spin-waits
    # multiply the CPU time tenfold: one thread (scikit-learn's threadpoolctl sets it for this process).
    threadpool_limits(1)
    digits = load_digits()
    images = (digits.images / 16.0 - 0.5).astype(np.float32)[:, None]  # [1797, 1, 8, 8]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    print(f"digits: {len(x_train)} training and {len(x_test)} test images")

    device = "cuda" if og.core.device.cuda_usable() else "cpu"
    g, loss, params = mobilenet(BATCH, training=True)
    step = step_graph(g, loss, params, SGD(LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY))
    plan = step.graph.build(device=device)
    eval_g, _, _ = mobilenet(len(x_test), training=False)
    eval_plan = eval_g.build(device=device)
    print(
        f"training step: {len(step.graph.final.nodes)} ops in {len(plan.steps)} kernel(s) on {plan.device}; "
        f"inference: {len(eval_plan.steps)} kernel(s)"
    )

    # the training pack, by UID: optimizer state, parameters (updated in place: outputs that are also
    # inputs), running stats, the batch (filled per step) and every other output
    f = step.graph.final
    rng = np.random.default_rng(0)
    pack = step.state_pack()  # the velocities (zeros), the device scalars (lr, momentum, weight decay), the seed
    for uid in (*(s.uid for s in step.params), *f.inputs):
        pack.setdefault(uid, init_value(f.tensors[uid], rng))
    for uid in f.outputs:
        pack.setdefault(uid, og.testing.empty_like_desc(f.tensors[uid]))
    x_uid, onehot_uid, loss_uid, lr_uid = (
        f.tensor("x").uid,
        f.tensor("onehot").uid,
        step.loss_uid,
        step.scalar("lr").uid,
    )
    if device == "cuda":
        from opgraph.core.torch_interop import pack_to_device

        pack = pack_to_device(pack, "cuda")
    # batchnorm writes the next running stats to other buffers: swapped after each step
    swaps = [(f.tensor(t.name.removesuffix("@next")).uid, u) for u, t in f.tensors.items() if t.name.endswith("@next")]

    def put(uid, value):  # write into a bound buffer (its address stays what the plan was given)
        value = np.asarray(value, dtype=np.float32).reshape(pack[uid].shape)
        if device == "cuda":
            import torch

            pack[uid].copy_(torch.from_numpy(np.ascontiguousarray(value)))
        else:
            pack[uid][...] = value

    def host(uid):
        return pack[uid].cpu().numpy() if device == "cuda" else pack[uid]

    def evaluate():
        names = {t.name: uid for uid, t in f.tensors.items()}
        eval_pack = {
            t.name: pack[names[t.name]]
            for t in eval_g.final.tensors.values()
            if not t.is_virtual and t.name in names and t.name != "x"
        }  # shared parameters and stats
        eval_pack.update({"x": x_test, "logits": np.empty((len(x_test), CLASSES, 1, 1), np.float32)})
        if device == "cuda":
            from opgraph.core.torch_interop import pack_to_device

            eval_pack.update(pack_to_device({k: eval_pack[k] for k in ("x", "logits")}, "cuda"))
        eval_plan.execute(eval_pack)
        out = eval_pack["logits"]
        out = out.cpu().numpy() if device == "cuda" else out
        return float(np.mean(out.reshape(len(x_test), CLASSES).argmax(axis=1) == y_test))

    steps_per_epoch = len(x_train) // BATCH
    total, start, accuracy = EPOCHS * steps_per_epoch, time.perf_counter(), 0.0
    order_rng = np.random.default_rng(1)
    for epoch in range(EPOCHS):
        order, losses = order_rng.permutation(len(x_train)), []
        for i in range(steps_per_epoch):
            t = epoch * steps_per_epoch + i
            put(lr_uid, LR * 0.5 * (1 + math.cos(math.pi * t / total)))  # cosine schedule, read at run time
            batch = order[i * BATCH : (i + 1) * BATCH]
            put(x_uid, x_train[batch])
            put(onehot_uid, np.eye(CLASSES, dtype=np.float32)[y_train[batch]])
            plan.execute(pack)  # weights, velocities updated in place
            for old, new in swaps:  # next step reads the updated running stats
                pack[old], pack[new] = pack[new], pack[old]
            losses.append(float(host(loss_uid).ravel()[0]))
        accuracy = evaluate()
        print(
            f"epoch {epoch + 1:2d}: mean loss {np.mean(losses):.4f}, test accuracy {accuracy:.2%} "
            f"({time.perf_counter() - start:.0f} s)"
        )
    print(f"final test accuracy {accuracy:.2%} after {total} steps ({time.process_time():.0f} s of CPU time)")
    if accuracy < 0.97:
        print("MISMATCH: below the 97% target")
        sys.exit(1)


if __name__ == "__main__":
    main()
