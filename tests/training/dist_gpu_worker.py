"""One rank of the GPU data-parallel tests (tests/training/test_distributed.py, marked gpu): run as
`python -m tests.training.dist_gpu_worker RANK WORLD INIT_FILE`, one GPU a rank, NCCL through the file
store. A batchnorm CNN (fp32) trained for 3 steps by a data-parallel opgraph step captured in a CUDA
graph (the NCCL calls inside), by the same with ZeRO-1 (SGD with momentum, clipping), and by torch DDP (broadcast_buffers=False) on
the same shards: losses and parameters agree. Prints "ok" on success."""

from __future__ import annotations

import os
import sys

for _var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ[_var] = "0" if _var == "NCCL_NVLS_ENABLE" else "1"


def main(argv: list[str]) -> None:
    rank, world, init_file = int(argv[0]), int(argv[1]), argv[2]
    import copy
    import faulthandler
    import traceback

    # a rank stuck in a collective prints where it is (every thread) and exits, before the test gives up
    faulthandler.dump_traceback_later(float(os.environ.get("OPGRAPH_DIST_DUMP_S", "300")), exit=True)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import opgraph as og
    from opgraph.training import SGD, train_step

    from .dist_worker import GLOBAL_BATCH, cnn

    torch.cuda.set_device(rank)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        base = cnn(torch.float32).cuda()
        models = {k: copy.deepcopy(base) for k in ("dp", "zero", "ddp")}
        gen = torch.Generator().manual_seed(1)
        per = GLOBAL_BATCH // world * 2
        data = [
            (torch.randn(per * world, 3, 6, 6, generator=gen), torch.randint(0, 5, (per * world,), generator=gen))
            for _ in range(3)
        ]
        shards = [(x[rank * per : (rank + 1) * per].cuda(), y[rank * per : (rank + 1) * per].cuda()) for x, y in data]
        steps = {
            k: train_step(
                og.from_torch(models[k], (shards[0][0],)),
                "cross_entropy",
                SGD(0.1, momentum=0.9),
                grad_clip_norm=0.5,
                process_group=dist.group.WORLD,
                bucket_cap_mb=400 / 2**20,
                zero=(k == "zero"),
            )
            for k in ("dp", "zero")
        }
        assert sum(n.kind == "all_reduce" for n in steps["dp"].graph.final.nodes) >= 2
        if rank == 0:
            print(steps["dp"].build("cuda").describe())
        captured = {k: s.capture(*shards[0]) for k, s in steps.items()}
        ddp = torch.nn.parallel.DistributedDataParallel(
            models["ddp"], device_ids=[rank], broadcast_buffers=False, bucket_cap_mb=400 / 2**20
        )
        topt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)  # (not AdamW: the conv biases before
        # batchnorm get rounding noise as gradients, which Adam's normalisation would turn into lr-sized steps)
        for i, (x, y) in enumerate(shards):
            topt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            topt.step()
            want = float(loss.detach())
            for k, c in captured.items():
                got = float(c.replay(x, y))
                assert abs(got - want) <= 1e-4 * abs(want), (rank, k, i, got, want)
        torch.cuda.synchronize()
        for k in ("dp", "zero"):
            for (name, p), q in zip(models[k].named_parameters(), models["ddp"].parameters()):
                torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5, msg=f"rank {rank}, {k}, {name}")
        for c in captured.values():  # (NCCL cannot destroy a communicator a live CUDA graph uses)
            c.release()
        print("ok")
    except BaseException:  # noqa: BLE001 - any failure: print it and leave without the collective teardown
        # the other rank may wait in a collective for good: destroy_process_group would too
        print(f"rank {rank} failed:\n{traceback.format_exc()}", flush=True)
        os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
