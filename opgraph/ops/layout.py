"""layout ops."""
