import sys
sys.argv = sys.argv[:1]
exec(open(".diag/torch_steps.py").read().split("real = ti")[0])
_P = {}

def _pieces():
    if not _P:
        m = _wrap(llama_model(1024, 1, 16, 4, 2816, 32000).to(torch.bfloat16).eval(), "logits")
        x = torch.randint(0, 32000, (8, 1024))
        with torch.no_grad():
            imp = og.from_torch(m, (x,))
        pcs = engine_configs(imp.graph.final, device=H200, engines=["triton", "torch"], heur_mode=HeurMode.B)
        _P.update({i: p.piece for i, p in enumerate(pcs)})
    return _P

HOPPER_CASES = {f"p{i}": ((lambda i=i: _pieces()[i]), "matmul", 6) for i in (2,)}
