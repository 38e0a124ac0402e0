"""Layer 2, building graphs: the user's `Graph` (`builder`), finalize (dataflow, order, inference,
validation -> core.ir.FinalGraph) and graph JSON (`serialize`). Imports core and ops; `Graph.build` and
`Graph.engine_configs` call the planner and runtime lazily: the one documented upward facade."""
