"""Data-parallel training steps (opgraph.training.distributed) on the CPU: 2 processes over gloo
(tests/training/dist_worker.py, a file store) against one process with the global batch: losses (their
mean), the clipped global gradient norm, the averaged gradients (the first SGD step's update) and the
parameters after every one of 3 steps, for SGD with momentum and AdamW, with and without clipping,
over one and several buckets, float64 on the reference engine and float32 on the torch engine; a
batchnorm CNN against torch DDP (per-rank batch statistics, DDP's semantics); ranks whose graphs
differ get a DistributedError naming the rank; ZeRO-1's sharded optimizer state, its parameter
broadcast (one per owner's buffer, no copies) and, with one rank, the plain step. Marked gpu
(tests/training/dist_gpu_worker.py): the one-GPU path (NCCL, world size 1) and two GPUs, captured in CUDA
graphs, against torch DDP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import requires_cuda

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
MLP = [
    "mlp_sgd",
    "mlp_sgd_clip",
    "mlp_adamw_buckets",
    "mlp_adamw_clip_buckets",
    "mlp_adamw_f32_torch",
    "mlp_sgd_zero",
    "mlp_adamw_clip_zero",
]
CNN = ["cnn_sgd_bn", "cnn_adamw_bn_clip", "cnn_cl_sgd_bn_zero"]
ZERO = ["mlp_sgd_zero", "mlp_adamw_clip_zero", "cnn_cl_sgd_bn_zero"]
TOL = {"float64": 1e-10, "float32": 2e-5}


def launch(tmp_path: Path, names: list[str], world: int = 2, timeout: float = 240) -> list[dict]:
    """Run the worker on `world` ranks; each rank's results."""
    init = tmp_path / "store"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "NCCL_NVLS_ENABLE": "0",
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.training.dist_worker",
                str(r),
                str(world),
                str(init),
                str(tmp_path / f"rank{r}.pt"),
                *names,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the ranks did not finish in time (a collective hung?)")
    results = []
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        for name, res in got.items():
            assert "traceback" not in res, f"rank {r}, {name}:\n{res['traceback']}"
        results.append(got)
    return results


@pytest.fixture(scope="module")
def mlp_runs(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("mlp"), [*MLP, "mismatch", "layout"])


@pytest.fixture(scope="module")
def cnn_runs(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("cnn"), CNN)


@pytest.fixture(scope="module")
def one_rank_runs(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("one"), ["mlp_sgd_small_buckets", "mlp_sgd_zero"], world=1)[0]


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize("name", MLP)
def test_two_ranks_train_like_one_process_with_the_global_batch(mlp_runs, name):
    from .dist_worker import SCENARIOS

    tol = TOL[SCENARIOS[name][4]]
    r0, r1 = mlp_runs[0][name], mlp_runs[1][name]
    for i, want in enumerate(r0["global_losses"]):
        mean = (r0["losses"][i] + r1["losses"][i]) / 2
        assert abs(mean - want) <= tol * abs(want), (i, mean, want)
        assert r0["losses"][i] != r1["losses"][i]  # each rank's own loss, of its own shard
        for key, want_p in r0["global_params"][i].items():
            assert rel(r0["params"][i][key], want_p) <= tol, (i, key, rel(r0["params"][i][key], want_p))
            assert torch.equal(r0["params"][i][key], r1["params"][i][key]), (i, key)  # one step on every rank
    if SCENARIOS[name][2] is not None:  # the global norm, before clipping: the same on both ranks
        assert r0["norms"] == r1["norms"] and all(n > SCENARIOS[name][2] for n in r0["norms"])
        for got, want in zip(r0["norms"], r0["global_norms"]):
            assert abs(got - want) <= tol * want, (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp_sgd_zero", "mlp_adamw_clip_zero"])
def test_zero1_shards_the_optimizer_state(mlp_runs, name):
    """Each parameter's state on one rank only, every parameter's on some rank, each rank's update ops
    for its own parameters only (the parameters themselves equal the global batch's: the test above)."""
    states = [mlp_runs[r][name]["state"] for r in (0, 1)]
    owned = [{k for k, names in st.items() if names} for st in states]
    assert owned[0] and owned[1] and not owned[0] & owned[1] and owned[0] | owned[1] == set(states[0])
    full = mlp_runs[0][name.replace("_zero", "" if "sgd" in name else "_buckets")]
    assert mlp_runs[0][name]["updates"] + mlp_runs[1][name]["updates"] == full["updates"]


@pytest.mark.slow
def test_zero1_with_one_rank_is_the_plain_step(one_rank_runs):
    """One rank owns every parameter: the same step graph, the same torch ops a step (no join, broadcast
    or copy of the parameters after the plan) and the same parameters as zero=False."""
    plain, zero = one_rank_runs["mlp_sgd_small_buckets"], one_rank_runs["mlp_sgd_zero"]
    assert zero["graph"] == plain["graph"]
    assert zero["run_ops"] == plain["run_ops"], (zero["run_ops"], plain["run_ops"])
    assert not {"cat", "broadcast_", "copy_"} & set(zero["after_ops"]), zero["after_ops"]
    assert zero["losses"] == plain["losses"]
    for got, want in zip(zero["params"], plain["params"]):
        assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZERO)
def test_zero1_broadcasts_each_owners_buffer_without_copies(mlp_runs, cnn_runs, name):
    """Each owner's parameters are views of one buffer: after the plan, one broadcast per owner and no
    join or copy back; the parameters keep their layouts (channels_last too)."""
    runs, plain = (cnn_runs, "cnn_sgd_bn") if name.startswith("cnn") else (mlp_runs, "mlp_sgd")
    for r in (0, 1):
        res = runs[r][name]
        extra = {k: v - runs[r][plain]["after_ops"].get(k, 0) for k, v in res["after_ops"].items()}
        # (the rest: batchnorm's running statistics written back, as without ZeRO)
        assert {k: v for k, v in extra.items() if v} == {"broadcast_": 2}, res["after_ops"]
        assert res["storages"] == 2
        assert res["strides"] == res["start_strides"]
    if name.startswith("cnn"):
        assert any(s != tuple(sorted(s, reverse=True)) for s in res["strides"].values())  # (channels_last)
    # a parameter given a new tensor (param.data = ...): laid out again, the next step equal on both ranks
    again = [runs[r][name]["relaid"] for r in (0, 1)]
    assert again[0]["storages"] == again[1]["storages"] == 2
    keys = [k for k in runs[0][name]["strides"]]  # (the parameters; running statistics are each rank's)
    assert all(torch.equal(again[0]["params"][k], again[1]["params"][k]) for k in keys)
    assert any(not torch.equal(again[0]["params"][k], runs[0][name]["params"][-1][k]) for k in keys)  # (it trained)


@pytest.mark.slow
def test_owned_params_lays_out_each_owners_parameters_and_broadcasts_them(mlp_runs):
    """Per owner and type one flat buffer (each parameter at an aligned offset, in its own strides); a
    parameter that is not dense is broadcast alone; every parameter ends with its owner's values."""
    for r in (0, 1):
        res = mlp_runs[r]["layout"]
        assert res["values"] == {"a": 1.0, "b": 2.0, "c": 1.0, "d": 2.0, "e": 2.0}, (r, res["values"])
        assert all(res["strides"].values()) and res["aligned"]
        assert res["flats"] == [(0, "torch.float32", 128), (0, "torch.float64", 64), (1, "torch.float32", 256)]
        assert res["loose"] == [1] and res["held"] and not res["held_after"]


@pytest.mark.slow
def test_the_averaged_gradients_equal_the_global_batchs(mlp_runs):
    """SGD's first step from a zero momentum buffer is W - lr * g: the update gives the gradient."""
    from .dist_worker import mlp

    r0 = mlp_runs[0]["mlp_sgd"]
    start = mlp(torch.float64).state_dict()
    for key, w0 in start.items():
        got = (w0 - r0["params"][0][key]) / 0.1
        want = (w0 - r0["global_params"][0][key]) / 0.1
        assert rel(got, want) <= 1e-9 and float(want.norm()) > 0, key


@pytest.mark.slow
def test_buckets_follow_the_cap(mlp_runs):
    counts = {name: mlp_runs[0][name]["buckets"] for name in MLP}
    assert counts["mlp_sgd"] == 1  # 25 MiB: one bucket
    assert counts["mlp_adamw_buckets"] >= 4 and counts["mlp_adamw_clip_buckets"] >= 2
    assert counts["mlp_adamw_buckets"] > counts["mlp_adamw_clip_buckets"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CNN)
def test_batchnorm_cnn_trains_like_ddp(cnn_runs, name):
    """Batch statistics per rank (DDP's semantics): each rank's loss and the parameters as torch DDP's;
    each rank keeps its own running statistics (DDP with broadcast_buffers=False). ZeRO-1 too, with
    channels_last parameters."""
    from .dist_worker import SCENARIOS

    for r in (0, 1):
        res = cnn_runs[r][name]
        assert res["buckets"] >= 2 or SCENARIOS[name][6]  # (ZeRO-1: a rank's buckets of every gradient)
        for i, (got, want) in enumerate(zip(res["losses"], res["ddp_losses"])):
            assert abs(got - want) <= 1e-10 * abs(want), (r, i, got, want)
        for i in range(len(res["params"])):
            for key, want in res["ddp_params"][i].items():
                assert rel(res["params"][i][key], want) <= 1e-9, (r, i, key)
        for got, want in zip(res["norms"], res["ddp_norms"]):
            assert abs(got - want) <= 1e-10 * want, (r, got, want)
    stats = [cnn_runs[r][name]["params"][-1]["1.running_mean"] for r in (0, 1)]
    assert not torch.equal(*stats)  # the ranks' own batches


@pytest.mark.slow
def test_ranks_whose_graphs_differ_get_a_typed_error_naming_the_rank(mlp_runs):
    for r in (0, 1):
        res = mlp_runs[r]["mismatch"]
        assert res["error"] == "DistributedError" and res["rule"] == "training.ranks_differ", res
        assert "rank 1" in res["message"] and "[3, 6]" in res["message"] and "[4, 6]" in res["message"]


def test_bucket_cap_and_an_uninitialized_group_are_refused():
    import opgraph as og
    from opgraph.training import SGD, train_step

    from .dist_worker import mlp

    model = mlp(torch.float64)
    imported = og.from_torch(model, (torch.randn(4, 6, dtype=torch.float64),))
    with pytest.raises(og.AttributeValueError, match="bucket_cap_mb"):
        train_step(imported, "cross_entropy", SGD(0.1), process_group=object(), bucket_cap_mb=0)
    with pytest.raises(og.AttributeValueError, match="process_group") as info:
        train_step(imported, "cross_entropy", SGD(0.1), zero=True)
    assert info.value.rule == "training.zero"
    if not dist.is_initialized():
        with pytest.raises(og.DistributedError, match="not initialized"):
            train_step(imported, "cross_entropy", SGD(0.1), process_group=object())


GPU_RANKS_S = 360  # the ranks' own limit: each builds and compiles its steps (2 ranks: ~70 s on an H200)


def launch_gpus(tmp_path: Path, world: int) -> None:
    env = {
        **os.environ,
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "OPGRAPH_DIST_DUMP_S": str(GPU_RANKS_S),  # a hung rank dumps its stacks (dist_gpu_worker)
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.training.dist_gpu_worker", str(r), str(world), str(tmp_path / "store")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=GPU_RANKS_S + 60)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        pytest.fail(
            "the GPU ranks did not finish in time:\n"
            + "\n".join(f"rank {r}:\n{log[-4000:]}" for r, log in enumerate(logs))
        )
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0 and log.rstrip().endswith("ok"), f"rank {r}:\n{log[-6000:]}"


@pytest.mark.gpu
@pytest.mark.timeout(GPU_RANKS_S + 120)
@requires_cuda
def test_one_gpu_data_parallel_step_is_captured_with_nccl(tmp_path):
    """World size 1 over NCCL: the distributed path (collectives on the communication stream) runs and
    is captured in a CUDA graph, with ZeRO-1 too; both train like torch DDP."""
    if not dist.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    launch_gpus(tmp_path, 1)


@pytest.mark.gpu
@pytest.mark.timeout(GPU_RANKS_S + 120)
@requires_cuda
def test_two_gpus_train_like_ddp_over_nccl(tmp_path):
    """Two ranks, a GPU each, NCCL: captured data-parallel steps (and ZeRO-1) train like torch DDP."""
    if not dist.is_nccl_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs and NCCL")
    launch_gpus(tmp_path, 2)
