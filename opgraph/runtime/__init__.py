"""Layer 5, running plans: ExecutionPlan (`plan`), variant-pack binding (`bindings`), CUDA graphs
(`cudagraph`), plan files (`plan_io`) and explanations (`explain`). Imports every layer below."""
