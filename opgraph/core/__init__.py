"""Layer 0, the vocabulary every other layer speaks: errors, data types, devices, tensor descriptors
and handles, what an op is (`core.op`), the finalized IR (`core.ir`), pieces (`core.piece`), the config
vocabulary (`core.config`: heuristic modes, notes, EngineConfig), rounding, timing, logging.
Imports nothing of opgraph outside itself."""
