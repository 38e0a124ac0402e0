"""Gradient graphs: `grad(graph, outputs, wrt)` builds the backward graph of a forward graph from
per-op backward rules (grad.py has the algorithm and the save / recompute policy, rules.py the
registry and the builder rules use, rules_<family>.py the rules).

    res = opgraph.grad(g, outputs=[loss], wrt=[w1, w2])
    res.keep_in(g)                      # forward outputs the tensors the backward reads
    bwd = res.graph                     # inputs: grad_loss and the saved tensors (forward UIDs)
    res.grads[w1.uid]                   # the output grad_w1
"""

# every family registers its rules on import
from . import (  # noqa: F401
    rules_adalayernorm,
    rules_attention,
    rules_causal_conv1d,
    rules_conv,
    rules_gather,
    rules_layout,
    rules_norm,
    rules_pointwise,
    rules_pooling,
    rules_reduction,
    rules_scan,
)
from .grad import CHEAP_KINDS, GradGraph, grad, saved_pack
from .rules import (
    CUSTOM_RULES,
    NOT_DIFFERENTIABLE,
    NOT_DIFFERENTIABLE_MODES,
    POINTWISE_RULES,
    RULES,
    GradBuilder,
    Rule,
    RuleContext,
    register_custom_grad,
    register_pointwise,
    register_rule,
    rule_for,
)

__all__ = [
    "CHEAP_KINDS",
    "CUSTOM_RULES",
    "NOT_DIFFERENTIABLE",
    "NOT_DIFFERENTIABLE_MODES",
    "POINTWISE_RULES",
    "RULES",
    "GradBuilder",
    "GradGraph",
    "Rule",
    "RuleContext",
    "grad",
    "register_custom_grad",
    "register_pointwise",
    "register_rule",
    "rule_for",
    "saved_pack",
]
