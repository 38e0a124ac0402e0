"""Placing ops where kernels can take them: views (slice, transpose, reshape: ops.layout.VIEW_KINDS)
next to the kernels that read them in place, and GEMM epilogues next to their GEMM (`place_epilogues`).

A view that sits between unrelated ops, or whose result several kernels read, is a tensor of its own:
the plan materialises it with a copy. Kernels that fold views into their loads (a GEMM's operands,
attention's q/k/v) can read the view's source instead, if the view is next to them in the graph's
order and theirs alone. So, after the topological order is fixed:

- a view read by several ops (and not a graph output) is duplicated, one copy per reader (a view of a
  view too: chains are duplicated whole), each with a virtual result of its own; except that a reshape
  whose result is no view of its input's memory (axes merged that are not one run) stays one for all
  its readers but pointwise ops: a GEMM, attention or a reduction reads it materialised, so they share
  one copy instead of making one each (ViT-B/16's attention gradient, transposed to tokens for the qkv
  projection's data gradient, weight gradient and bias sum, was copied three times a layer:
  bench/results/constants.md#shared-view-copies), and a view of it is a plain view of that copy; a
  pointwise reader gets its own (it gathers through the view in its loads);
- each view then moves to just before the first op that depends on it: its reader, or an op that
  updates in place the tensor it reads (the view must read the old value).

Neither changes a value: a view's result is a function of its input alone.

Last, generators (`place_generators`): an op making a large value from small ones moves to just before
the first op reading it, where that op's kernel computes it in registers instead of reading it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from ..core.ir import Node
from ..core.tensor import TensorDesc, reshape_strides
from ..ops.layout import VIEW_KINDS


def place_views(nodes: list[Node], descs: dict[int, TensorDesc]) -> list[Node]:
    """`nodes` (a topological order) with shared views duplicated per reader and every view placed
    right before the first op that depends on it; new result tensors are added to `descs`."""
    if not any(n.kind in VIEW_KINDS for n in nodes):
        return nodes
    nodes = _duplicate_shared(nodes, descs)
    return _sink(nodes)


_GEMMS = ("matmul", "conv_fprop", "conv_dgrad", "conv_wgrad")
_EPILOGUE = ("pointwise", "reduction", "concatenate")


def place_epilogues(nodes: list[Node], descs: Mapping[int, TensorDesc] | None = None) -> list[Node]:
    """`nodes` with each GEMM-class op's would-be epilogue moved up to just after it: the pointwise op
    that alone reads the GEMM's result, then the pointwise ops and reductions that read what was moved
    (the GELU backward and bias gradient after a data-gradient GEMM, which autodiff records after the
    weight gradient's GEMM and its optimizer update); a reduction ends such a chain. An op moves only
    when every tensor it reads is already final at its new place (no op in between writes it, in place
    or otherwise), or is a view of such tensors that only it reads (a norm's weight reshaped to
    broadcast, which place_views put right before it): the view moves with it. Ops updating a tensor in
    place never move. An epilogue op already in its place (next to what it reads) leads on as a moved one
    does, except that a cast to a wider type is not moved after it alone (`descs` tell the types: the fp32
    copy of a norm's bf16 input, which its normalising step recomputes, is not to be stored by the GEMM).
    An op joins after the last op its GEMM's epilogue has so far, so epilogue ops keep their order and
    placing a placed order again leaves it (a plan file's graph is placed again when read). The GEMM
    template then fuses them (or not: the order stays valid either way)."""
    return _EpiloguePlacer(nodes, descs).run()


class _EpiloguePlacer:
    """place_epilogues' walk: `out` the order so far; `last_write` the position in it of each tensor's
    last write; `chain` the GEMM (by its result's UID) each GEMM result and joined epilogue op's result
    belongs to, and `tail` the position of that epilogue's last op so far: an op joins after it, so that
    ops keep their order and placing an order again leaves it as it is. `moved`: results of the ops moved
    (the others in a chain were found in their place)."""

    def __init__(self, nodes: list[Node], descs: Mapping[int, TensorDesc] | None) -> None:
        self.nodes, self.descs = nodes, descs
        self.readers: dict[int, int] = {}
        for n in nodes:
            for u in set(n.input_uids()):
                self.readers[u] = self.readers.get(u, 0) + 1
        self.out: list[Node] = []
        self.last_write: dict[int, int] = {}
        self.chain: dict[int, int] = {}
        self.tail: dict[int, int] = {}
        self.gemms: set[int] = set()
        self.moved: set[int] = set()

    def run(self) -> list[Node]:
        for n in self.nodes:
            found = self._target(n)
            if found is not None and found[0] < len(self.out):
                self._move(n, *found)
                continue
            for u in n.output_uids():
                self.last_write[u] = len(self.out)
                if n.kind in _GEMMS:
                    self.gemms.add(u)
                    self.chain[u], self.tail[u] = u, len(self.out)
            if found is not None:  # (in its place already)
                self._joined(n, len(self.out))
            self.out.append(n)
        return self.out

    def _root(self, u: int) -> int:
        """Tensor u, or where u is made by views of one reader each (a product split into heads and
        transposed, as a rotary embedding reads it), the tensor those views read."""
        while u not in self.chain and self.readers.get(u) == 1:
            i = self.last_write.get(u)
            if i is None or self.out[i].kind not in VIEW_KINDS:
                break
            u = self.out[i].input_uids()[0]
        return u

    def _chains(self, n: Node) -> set[int]:
        roots = {self._root(u) for u in n.input_uids()}
        return {self.chain[u] for u in roots if u in self.chain}

    def _joined(self, n: Node, at: int) -> None:
        """Epilogue op `n` is at position `at` of the chains it reads from."""
        chains = self._chains(n)
        for c in chains:
            self.tail[c] = at
        if n.kind in ("pointwise", "concatenate"):  # (a reduction ends the epilogue: its readers stay)
            for u in n.output_uids():
                self.chain[u] = min(chains)

    def _target(self, n: Node) -> tuple[int, list[int]] | None:
        """Where epilogue op `n` goes, with the positions of the views that move with it; None: it stays."""
        ins = n.input_uids()
        if n.kind not in _EPILOGUE or set(ins) & set(n.output_uids()):
            return None
        # what leads it on: a joined epilogue op's result, or a GEMM's result that it alone reads (or views of
        # either that only it reads: the GEMM's result may have other readers then, each through views)
        viewed = {self._root(u) for u in ins} - set(ins)
        heads = [u for u in ins if u in self.chain and (u not in self.gemms or self.readers.get(u) == 1)]
        heads += [u for u in viewed if u in self.chain]
        if not heads or (not any(u in self.moved or u in self.gemms for u in heads) and self._widens(n)):
            return None
        at = max(self.tail[c] for c in self._chains(n)) + 1  # (after its heads: each is in a chain)
        views = self._carried(ins, at)
        return None if views is None else (at, views)

    def _widens(self, n: Node) -> bool:
        if self.descs is None:
            return False
        size = max((self.descs[u].data_type.itemsize for u in n.input_uids()), default=0)
        return any(self.descs[u].data_type.itemsize > size for u in n.output_uids())

    def _carried(self, ins: tuple[int, ...], at: int) -> list[int] | None:
        """Positions in `out` of the views that must move with an op reading `ins` to `at` (all that
        block it), or None where something else blocks it."""
        views: set[int] = set()
        todo = list(dict.fromkeys(ins))  # (a chain of views moves whole; walked without recursion: chains are long)
        while todo:
            u = todo.pop()
            i = self.last_write.get(u, -1)
            if i < at or i in views:
                continue
            v = self.out[i]
            if v.kind not in VIEW_KINDS or self.readers.get(u) != 1:
                return None
            views.add(i)
            todo.extend(v.input_uids())
        return sorted(views)

    def _move(self, n: Node, target: int, views: list[int]) -> None:
        for view in reversed([self._take(i) for i in reversed(views)]):  # (in their order)
            self._place(view, target)
            for u in view.output_uids():
                self.last_write[u] = target
            target += 1
        self._place(n, target)
        for u in n.output_uids():
            self.last_write[u] = target
            self.moved.add(u)
        self._joined(n, target)

    def _tables(self) -> tuple[dict[int, int], ...]:
        return (self.last_write, self.tail)

    def _place(self, n: Node, at: int) -> None:
        self.out.insert(at, n)
        for table in self._tables():
            for u, i in table.items():
                if i >= at:
                    table[u] = i + 1

    def _take(self, at: int) -> Node:
        for table in self._tables():
            for u, i in table.items():
                if i > at:
                    table[u] = i - 1
        return self.out.pop(at)


def _readers(nodes: list[Node]) -> dict[int, list[int]]:
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for u in dict.fromkeys(n.input_uids()):
            readers.setdefault(u, []).append(i)
    return readers


def _writers_in_place(nodes: list[Node]) -> dict[int, list[int]]:
    """Each tensor some op updates in place, with the positions of those ops."""
    writers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for u in set(n.input_uids()) & set(n.output_uids()):
            writers.setdefault(u, []).append(i)
    return writers


def _duplicate_shared(nodes: list[Node], descs: dict[int, TensorDesc]) -> list[Node]:
    """Each view whose virtual result has several readers becomes one view per reader (walking back
    from the last op, so the copies of a view's readers make the view itself shared in turn)."""
    next_uid = max(descs) + 1
    slots = [[n] for n in nodes]  # slot[0]: the node there now (a reader's inputs get rewired)
    readers: dict[int, list[list[Node]]] = {}
    for slot in slots:
        for u in dict.fromkeys(slot[0].input_uids()):
            readers.setdefault(u, []).append(slot)
    copies_after: dict[int, list[list[Node]]] = {}
    for i in range(len(slots) - 1, -1, -1):
        n = slots[i][0]
        out = n.output_uids()
        if not (n.kind in VIEW_KINDS and len(out) == 1 and descs[out[0]].is_virtual):
            continue
        uid = out[0]
        for k, reader in enumerate(_duplicated_for(n, readers.get(uid, []), descs), start=1):
            new = next_uid
            next_uid += 1
            descs[new] = replace(descs[uid], uid=new, name=f"{descs[uid].name}~{k}")
            copy = [replace(n, name=f"{n.name}~{k}", outputs=(new,))]
            reader[0] = replace(reader[0], inputs=tuple(new if v == uid else v for v in reader[0].inputs))
            copies_after.setdefault(i, []).append(copy)
            for u in dict.fromkeys(n.input_uids()):
                readers[u].append(copy)
    out_nodes = []
    for i, slot in enumerate(slots):
        out_nodes.append(slot[0])
        out_nodes.extend(c[0] for c in copies_after.get(i, ()))
    return out_nodes


def _duplicated_for(view: Node, readers: list[list[Node]], descs: dict[int, TensorDesc]) -> list[list[Node]]:
    """The readers of `view` that get a copy of their own (the first keeps the view): all but the first,
    except for a reshape that needs a copy, which only its pointwise readers get (module docstring)."""
    if view.kind != "reshape" or len(readers) < 2:
        return readers[1:]
    src, out = descs[view.input_uids()[0]], descs[view.output_uids()[0]]
    sizes = (*src.dim, *src.stride, *out.dim)
    if not all(isinstance(v, int) for v in sizes) or reshape_strides(src.dim, src.stride, out.dim) is not None:
        return readers[1:]
    gathering = [r for r in readers if r[0].kind == "pointwise"]
    return readers[1:] if len(gathering) == len(readers) else gathering


def _sink(nodes: list[Node]) -> list[Node]:
    """Each view moved to just before the first op that depends on it."""
    pos = {id(n): i for i, n in enumerate(nodes)}
    readers = _readers(nodes)
    writers = _writers_in_place(nodes)
    attached: dict[int, list[Node]] = {}
    # Walking back, so a view's dependents have their places first: a view of a view goes with it (chains
    # stay whole) unless an update of what it reads comes before the place its reader moved to.
    lands: dict[int, int] = {}  # position of a moved view -> position of the op it now sits right before
    for i in range(len(nodes) - 1, -1, -1):
        n = nodes[i]
        if n.kind not in VIEW_KINDS:
            continue
        after = [r for u in n.output_uids() for r in readers.get(u, []) if r > i]
        after += [w for u in n.input_uids() for w in writers.get(u, []) if w > i]
        if not after:
            continue
        first = min(after, key=lambda d: (lands.get(d, d), d not in lands))
        attached.setdefault(first, []).insert(0, n)
        lands[i] = lands.get(first, first)
    out: list[Node] = []
    for i, n in enumerate(nodes):
        if i in lands:  # (placed with the op it was attached to)
            continue
        stack = [(n, False)]  # (each node after the views attached to it, theirs first: no recursion)
        while stack:
            m, ready = stack.pop()
            if ready:
                out.append(m)
                continue
            stack.append((m, True))
            stack.extend((v, False) for v in reversed(attached.get(pos[id(m)], ())))
    return out


# a generator's operand, if not a shape, a literal or another generator's value, is broadcast into at least
# this many elements of the result each (a dynamic size counts as many); GQA's repeat of keys and values
# (a broadcast along an axis of 2 to 8 heads) is no generator
GENERATED_PER_READ = 16


def place_generators(nodes: list[Node], descs: Mapping[int, TensorDesc]) -> list[Node]:
    """`nodes` with each generator placed right before the op reading its value, after the generators and
    views it reads. A generator is a pointwise op whose virtual result one op reads and whose operands are
    all cheap to read there: a shape (`gen_index` reads its input's dims only), a literal, another
    generator's value, or a value broadcast into GENERATED_PER_READ elements of the result or more each (a
    per-row target); views of generators' values and views only generators read move with them; nothing
    reading a tensor that an op updates in place moves. The topological order puts a generator as early
    as its inputs allow: cross-entropy's one-hot labels (`cmp_eq(gen_index(logits), target)`, [tokens,
    vocab] floats) came right after the logits, the greedy partition fused them into the max's reduction,
    and that kernel wrote them out for the two later passes reading them (1 GB for the Llama training
    step's 4096 x 32000 logits: bench/results/constants.md#generators). Placing an order again leaves it."""
    producer = {u: i for i, n in enumerate(nodes) for u in n.output_uids()}
    late = _generators(nodes, descs, producer)
    if not late:
        return nodes
    out: list[Node] = []
    placed: set[int] = set()

    def place(n: Node, chain: list[Node]) -> None:
        """The late ops n reads, each after the late ops it reads (depth first, no recursion: a chain of
        views may be long), onto `chain`."""
        stack: list[tuple[int, bool]] = [(p, False) for p in reversed(late_inputs(n))]
        while stack:
            i, ready = stack.pop()
            if i in placed:
                continue
            if ready:
                placed.add(i)
                chain.append(nodes[i])
                continue
            stack.append((i, True))
            stack.extend((p, False) for p in reversed(late_inputs(nodes[i])))

    def late_inputs(n: Node) -> list[int]:
        found = (producer.get(u) for u in dict.fromkeys(n.input_uids()))
        return [p for p in found if p is not None and p in late and p not in placed]

    for i, n in enumerate(nodes):
        if i in late:
            continue
        chain: list[Node] = []
        place(n, chain)
        if not chain:
            out.append(n)
            continue
        # before the views place_views put right before n (unless they and the generators are related)
        made = {u for m in chain for u in m.output_uids()}
        read = {u for m in chain for u in m.input_uids()}
        at = len(out)
        while at and out[at - 1].kind in VIEW_KINDS:
            v = out[at - 1]
            if made & set(v.input_uids()) or read & set(v.output_uids()):
                break
            at -= 1
        out[at:at] = chain
        out.append(n)
    out += [n for i, n in enumerate(nodes) if i in late and i not in placed]  # (generators no op reads)
    return out


def _generators(nodes: list[Node], descs: Mapping[int, TensorDesc], producer: Mapping[int, int]) -> set[int]:
    """Positions of the generators, the views of their values and the views only generators read
    (place_generators; `producer`: the position of each tensor's producer)."""
    in_place = _writers_in_place(nodes).keys()
    readers = _readers(nodes)
    late: set[int] = set()
    for i, n in enumerate(nodes):
        outs = n.output_uids()
        if not outs or set(n.input_uids()) & in_place:
            continue
        if not all(descs[u].is_virtual and len(readers.get(u, ())) == 1 for u in outs):
            continue  # (a value several ops read stays where the first kernel reading it can store it)
        if n.kind in VIEW_KINDS:
            if all(producer.get(u) in late for u in n.input_uids()):
                late.add(i)
        elif n.kind == "pointwise" and _cheap_operands(n, descs, late, producer):
            late.add(i)
    for i in range(len(nodes) - 1, -1, -1):  # (views that only generators read, the last first)
        n = nodes[i]
        if n.kind in VIEW_KINDS and i not in late and all(descs[u].is_virtual for u in n.output_uids()):
            read_by = [r for u in n.output_uids() for r in readers.get(u, [])]
            if read_by and all(r in late for r in read_by) and not set(n.input_uids()) & in_place:
                late.add(i)
    return late


def _cheap_operands(n: Node, descs: Mapping[int, TensorDesc], late: set[int], producer: Mapping[int, int]) -> bool:
    (out_role,) = n.op.output_roles()
    out = descs[n.output_uids()[0]].dim
    for role, v in zip(n.op.input_roles(), n.inputs):
        if not isinstance(v, int) or n.op.dependence(out_role, role) == "none" or producer.get(v) in late:
            continue
        dims = descs[v].dim
        if len(dims) != len(out):
            return False
        spread = [o for d, o in zip(dims, out) if d == 1 and o != 1]  # (the axes it is broadcast along)
        if not any(not isinstance(o, int) for o in spread) and math.prod(spread) < GENERATED_PER_READ:
            return False
    return True
