"""Training any imported model as one graph (layer 7).

    step = opgraph.training.train_step(opgraph.from_torch(model.train(), (x,)),
                                       loss="cross_entropy", optimizer=opgraph.training.AdamW(3e-4),
                                       mixed_precision="bf16", grad_clip_norm=1.0)
    loss = step.run(x, target)

`step` (train_step, TrainStep): forward, loss, backward, clipping and the optimizer's update in one plan;
`optimizers` (SGD, AdamW: every hyper-parameter a device scalar); `losses` (cross-entropy, mse, your
own); `forward` (the imported graph prepared for training: tied weights, training-form norms,
autocast casts); `classifier` (`classifier_step`, `sgd_momentum`: the CNN training steps, cases of the same).
"""

from .classifier import ClassifierStep, TrainingStep, classifier_step, sgd_momentum, softmax_cross_entropy
from .losses import MSE, CrossEntropy, Loss, stop_gradient
from .optimizers import SGD, AdamW, Optimizer
from .step import CapturedStep, TrainStep, train_step

__all__ = ["TrainingStep", "sgd_momentum", "softmax_cross_entropy", "ClassifierStep", "classifier_step",
           "train_step", "TrainStep", "CapturedStep", "SGD", "AdamW", "Optimizer", "CrossEntropy", "MSE", "Loss",
           "stop_gradient"]
