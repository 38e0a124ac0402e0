"""The benchmark's pure-Python parts (no torch, no GPU): the workload registry, the tolerance rule,
floor arithmetic, result records, repeat aggregation and table rendering. Unit-tested on the CPU
(tests/bench/)."""
