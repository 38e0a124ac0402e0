"""Import a PyTorch model with opgraph.from_torch: torchvision's ResNet-18 when torchvision is
installed, else a small ResNet-style model defined below. Prints the import report (what each traced
node became) and the plan, runs the graph and compares it with PyTorch.

On a GPU: 224x224 through the default engines. On the CPU: the reference engine at 32x32.
"""

import sys

import torch
from torch import nn

import opgraph as og


class Block(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, plus the (projected) input, relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            None
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def small_resnet(num_classes=10):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        Block(16, 16, 1),
        Block(16, 32, 2),
        Block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


device = "cuda" if og.core.device.cuda_usable() else "cpu"
try:
    import torchvision

    model, what = torchvision.models.resnet18(num_classes=10), "torchvision's resnet18"
except ImportError:
    model, what = small_resnet(), "a small ResNet-style model (torchvision is not installed)"
torch.manual_seed(0)
with torch.no_grad():  # batchnorm statistics that are not the identity
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
model = model.eval().to(device)
size = 224 if device == "cuda" else 32
x = torch.randn(2, 3, size, size, device=device).to(memory_format=torch.channels_last)

imported = og.from_torch(model, (x,))  # traced with torch.export, translated op by op
print(f"imported {what}: {imported!r}")
print(imported.report.summary())
for entry in imported.report.entries[:12]:
    print("  ", entry)
print(f"   ... {len(imported.report.entries) - 12} more")

plan = imported.plan(device)
print(plan.describe())

got = imported.run(x)  # parameters bound from the module, outputs in the module's structure
with torch.no_grad():
    want = model(x)
err = float((got - want).abs().max() / want.abs().max())
tol = 5e-3 if device == "cuda" else 1e-4  # generated fp32 GEMMs may run as TF32 on the GPU
print(f"logits {tuple(got.shape)}, max error relative to max |logit|: {err:.2e} (tolerance {tol:.0e})")
if err > tol:
    print("MISMATCH")
    sys.exit(1)
print("matches PyTorch")
