"""A compiled kernel that asks for more shared memory than the device has is a failed compile (the build
takes the step's next config) rather than an ExecutionError at the plan's first bind."""

from __future__ import annotations

from opgraph.engines.triton import compiler, native


def _spec(name: str) -> compiler.KernelSpec:
    return compiler.KernelSpec(
        path=f"/nowhere/{name}.py",
        module=f"m_{name}",
        kernel=name,
        signature=(("x", "*fp16"),),
        constexprs=(),
        aligned=(),
        options=(("num_warps", 8),),
        target=("cuda", 90, 32),
    )


def test_a_binary_over_the_devices_shared_memory_fails_its_compile(monkeypatch):
    monkeypatch.setattr(native, "shared_limit", lambda device_index=0: 232448)
    big, small, tiny = _spec("big"), _spec("small"), _spec("tiny")
    for spec, shared in ((big, 245784), (small, 200000), (tiny, 1024)):
        monkeypatch.setitem(
            compiler._BINARIES,
            spec.key,
            compiler.KernelBinary(spec.key, b"\0", {"name": spec.kernel, "shared": shared}),
        )
    report = compiler.compile_all({s.key: (s, None) for s in (big, small, tiny)}, parallel=False)
    assert set(report.failed) == {big.key}
    assert "245784 bytes of shared memory, the device has 232448" in report.failed[big.key]


def test_without_a_driver_the_bind_checks(monkeypatch):
    def no_driver(device_index=0):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(native, "shared_limit", no_driver)
    spec = _spec("big")
    monkeypatch.setitem(
        compiler._BINARIES, spec.key, compiler.KernelBinary(spec.key, b"\0", {"name": "big", "shared": 10**6})
    )
    assert not compiler.compile_all({spec.key: (spec, None)}, parallel=False).failed


def test_small_kernels_never_ask_the_driver(monkeypatch):
    def boom(device_index=0):
        raise AssertionError("queried the driver")

    monkeypatch.setattr(native, "shared_limit", boom)
    assert native.too_big(49152) is None
