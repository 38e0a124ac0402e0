"""Layer 5, running plans: ExecutionPlan (`plan`), its runtime state (`state`: the frozen PlanState;
`threads`: each thread's binding), variant-pack binding (`bindings`), bound launches (`bound`,
`autograph`), CUDA graphs (`cudagraph`), plan files (`plan_io`, checked against `plan_schema`).
Imports every layer below."""
