"""A plan file's per-string limit (core.limits.check_strings) skips the embedded kernels' payloads:
a cubin in base64 is longer than any name, and a plan of a real convolution carried 227,424 characters
(the GPU fuzz's plan-file round trips all failed on it)."""

import pytest

from opgraph.core.errors import SerializationError
from opgraph.core.limits import check_strings
from opgraph.runtime.plan_io import PAYLOADS


def test_embedded_kernels_are_bounded_by_the_file_size_only(monkeypatch):
    monkeypatch.setenv("OPGRAPH_MAX_STRING", "50")
    check_strings({"artifacts": [{"kind": "cubin", "data": "A" * 500}]}, "plan", PAYLOADS)
    with pytest.raises(SerializationError) as ei:  # anywhere else, as long a string is refused
        check_strings({"artifacts": [{"kind": "A" * 500, "data": ""}]}, "plan", PAYLOADS)
    assert ei.value.rule == "file.string_limit" and "plan.artifacts[0].kind" in str(ei.value)
    with pytest.raises(SerializationError):  # a key named like the payload is still a key
        check_strings({"data": {"B" * 500: 1}}, "plan", PAYLOADS)
