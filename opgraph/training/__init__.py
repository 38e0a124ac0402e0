"""Training any model as one graph (layer 7): the one training API.

    step = opgraph.training.train_step(opgraph.from_torch(model.train(), (x,)),
                                       loss="cross_entropy", optimizer=opgraph.training.AdamW(3e-4),
                                       mixed_precision="bf16", grad_clip_norm=1.0)
    loss = step.run(x, target)

`step` (train_step, TrainStep: binds an imported module to its step graph and runs it); `module_graph`
and `step_graph` (the step's graph, built by pure functions: `step_graph(g, loss, params, optimizer)`
for a graph you built yourself); `optimizers` (SGD, AdamW: every hyper-parameter a device scalar);
`losses` (cross-entropy, one-hot cross-entropy, mse, your own; stop_gradient); `forward` (the imported
graph prepared for training: tied and sliced parameters, training-form norms, autocast casts);
`distributed` (data-parallel steps: `train_step(..., process_group=group)`, gradients averaged over a
torch.distributed group in buckets); `classifier` (the deprecated `sgd_momentum` and `classifier_step`, wrappers of the above).
"""

from .classifier import ClassifierStep, TrainingStep, classifier_step, sgd_momentum
from .losses import MSE, CrossEntropy, Loss, OneHotCrossEntropy, softmax_cross_entropy, stop_gradient
from .module_graph import ModuleStepGraph, module_step_graph
from .optimizers import SGD, AdamW, Optimizer
from .step import CapturedStep, TrainStep, train_step
from .step_graph import AnalyticSeed, GradientHook, ParamSlot, StepGraph, step_graph

__all__ = [
    "train_step",
    "TrainStep",
    "CapturedStep",
    "step_graph",
    "StepGraph",
    "ParamSlot",
    "AnalyticSeed",
    "GradientHook",
    "module_step_graph",
    "ModuleStepGraph",
    "SGD",
    "AdamW",
    "Optimizer",
    "CrossEntropy",
    "OneHotCrossEntropy",
    "MSE",
    "Loss",
    "stop_gradient",
    "softmax_cross_entropy",
    "TrainingStep",
    "sgd_momentum",
    "ClassifierStep",
    "classifier_step",
]
