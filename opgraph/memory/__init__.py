"""Layer 2, buffers: what a variant-pack entry is (`buffers`), the plan workspace (`workspace`), the
address table of by-reference tensors (`addresses`), host buffers with a tensor's layout (`fill`).
Imports core only."""
