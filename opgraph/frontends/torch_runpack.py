"""The variant pack `ImportedGraph.run` reuses per plan, device and shape (`_RunPack`), the random
draws of bound inputs, and a tensor's layout at one shape of the dynamic dims."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.tensor import Tensor
    from ..core.types import UidPack

RUN_PACKS = 8  # the variant packs `run` keeps (per plan, device and shape)


def _layout(desc: Any, env: Mapping[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tensor's dims and strides at a shape of the dynamic dims (as declared where static)."""
    if not env:
        return desc.dim, desc.stride
    from ..core.symbolic import evaluate

    return tuple(evaluate(d, env) for d in desc.dim), tuple(evaluate(s, env) for s in desc.stride)


def _draw(spec: Any, base: Any, generator: Any = None) -> Any:
    """Fill `base` in place with a draw of `spec`; returns it."""
    if spec.dist == "bernoulli":
        base.bernoulli_(spec.p, generator=generator)
    elif spec.dist == "uniform":
        base.uniform_(generator=generator)
    elif spec.dist == "seed":  # an integer seed the reference engine reads exactly (< 2**53)
        base.random_(0, 2**53, generator=generator)
    else:
        base.normal_(generator=generator)
    return base


def _derived_leaves(imported: Any, source: Any) -> list[Any]:
    """The sources a derived input is computed from, through derived inputs computed from others
    (an argsort of a buffer, then a cast of it): the module tensors whose updates make it stale."""
    if source.kind != "derived":
        return []
    out: list[Any] = []
    for s in imported.derived[source.key].inputs:
        out += _derived_leaves(imported, s) if s.kind == "derived" else [s]
    return out


class _RunPack:
    """The variant pack `ImportedGraph.run` reuses for one plan and device: input buffers in the
    declared layouts (the caller's inputs are copied in), the module's tensors bound as views (in-place
    updates, an optimizer's, are seen through them), constants, random inputs (redrawn in place per
    call) and output buffers. `current` says whether the module's tensors are still the ones bound
    (same objects at the same addresses); `refresh` prepares a call."""

    def __init__(
        self,
        imported: Any,
        leaves: list[Any],
        device: Any,
        env: Mapping[str, int] | None = None,
        like: _RunPack | None = None,
    ) -> None:
        """`like`: a current pack of the same plan and device at another shape, whose bound module tensors,
        constants and derived inputs (the same at every shape) this one takes instead of resolving them."""
        import torch

        final = imported.graph.final
        env = env or {}
        self.pack: UidPack = {}
        self.inputs: list[tuple[int, Any, Any, Tensor]] = []  # (leaf index, buffer seen in torch shape, dtype, handle)
        for i, (handle, value) in enumerate(zip(imported._input_slots, leaves)):
            if handle is None:
                continue
            d = final.tensors[handle.known_uid()]
            dims, strides = _layout(d, env)
            buf = torch.empty_strided(dims, strides, dtype=d.data_type.to_torch(), device=device)
            self.pack[d.uid] = buf
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(torch.as_tensor(value).shape)
            self.inputs.append((i, buf.view(shape) if shape != dims else buf, d.data_type.to_torch(), handle))
        self.env = dict(env)
        # module tensors bound: (the dict holding it, its name, the tensor, its address)
        self.watch: list[tuple[dict, str, Any, int]] = []
        # derived inputs: recomputed when a tensor they are computed from is updated in place
        self.derived: list[tuple[int, Any, list[tuple[Any, int]]]] = []
        self.randoms: list[tuple[Any, Any]] = []  # drawn by `refresh`, in variant_pack's order
        self.random_uids: list[tuple[int, tuple[Any, Any, Any]]] = []  # (uid, (spec, its buffer, source))
        if like is not None:
            self._bound_like(imported, like, device)
        else:
            self._bind_module(imported, device)
        for uid in final.outputs:
            d = final.tensors[uid]
            dims, strides = _layout(d, env)
            self.pack[uid] = torch.empty_strided(dims, strides, dtype=d.data_type.to_torch(), device=device)

    def _bound_like(self, imported: Any, like: _RunPack, device: Any) -> None:
        """The module's side of `like` (its watch list, derived inputs and their bases' versions, the bound
        tensors), its random inputs drawn into buffers of this pack's own."""
        import torch

        self.watch += like.watch
        self.derived += like.derived
        randoms = {uid for uid, _ in like.random_uids}
        for handle, _ in imported._bound:
            uid = handle.known_uid()
            if uid not in randoms:
                self.pack[uid] = like.pack[uid]
        drawn: dict[int, Any] = {}
        for uid, (spec, base, source) in like.random_uids:
            if id(base) not in drawn:
                drawn[id(base)] = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                self.randoms.append((spec, drawn[id(base)]))
            self.pack[uid] = source.apply(drawn[id(base)])
            self.random_uids.append((uid, (spec, drawn[id(base)], source)))

    def _bind_module(self, imported: Any, device: Any) -> None:
        import torch

        tensors: dict[tuple[str, str], Any] = {}
        for _, source in imported._bound:
            for src in (source, *_derived_leaves(imported, source)):
                key = (src.kind, src.key)
                if src.kind in ("parameter", "buffer") and key not in tensors:
                    path, _, name = src.key.rpartition(".")
                    owner = imported.module.get_submodule(path)
                    table = owner._parameters if src.kind == "parameter" else owner._buffers
                    tensors[key] = table[name]
                    if table[name] is not None:
                        self.watch.append((table, name, table[name], table[name].data_ptr()))
        for handle, source in imported._bound:
            if source.kind == "derived":
                bases = [
                    tensors[(s.kind, s.key)]
                    for s in _derived_leaves(imported, source)
                    if (s.kind, s.key) in tensors and tensors[(s.kind, s.key)] is not None
                ]
                self.derived.append((handle.known_uid(), source, [(b, b._version) for b in bases]))
        drawn: dict[str, Any] = {}
        cache: dict[tuple[str, str], Any] = {}
        for handle, source in imported._bound:
            if source.kind != "random":
                self.pack[handle.known_uid()] = imported._resolve(source, cache, {}, device, None)
                continue
            spec = imported.randoms[source.key]
            if source.key not in drawn:
                drawn[source.key] = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                self.randoms.append((spec, drawn[source.key]))
            self.pack[handle.known_uid()] = source.apply(drawn[source.key])
            self.random_uids.append((handle.known_uid(), (spec, drawn[source.key], source)))

    def current(self, imported: Any) -> bool:
        return all(t.data_ptr() == ptr and table.get(name) is t for table, name, t, ptr in self.watch)

    def refresh(self, imported: Any, leaves: list[Any]) -> UidPack:
        import torch

        for i, buf, dtype, handle in self.inputs:
            x = leaves[i]
            if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.shape != buf.shape:
                x = imported._user_input(handle, x, self.env).reshape(buf.shape)  # converts, or says what is wrong
            if x is not buf:
                buf.copy_(x)
        for k, (uid, source, bases) in enumerate(self.derived):
            if any(b._version != v for b, v in bases):
                self.pack[uid] = imported._resolve(source, {}, {}, None, None)
                self.derived[k] = (uid, source, [(b, b._version) for b, _ in bases])
        for spec, base in self.randoms:
            _draw(spec, base)
        return self.pack
