"""Layer 4, from a finalized graph to compiled steps: partition into pieces, rank engine configs
(heuristics), filter them (cuDNN's note/engine/workspace filters), time them (autotune, with its disk
cache), and the planner that does all of it (`planner.plan_steps`). Imports core, ops, graph, memory,
engines."""
