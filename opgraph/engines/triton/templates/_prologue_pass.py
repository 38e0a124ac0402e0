"""A conv template's operand prologue run as its own pass first (knob PROLOGUE_PASS=1).

conv_fprop and conv_wgrad load the image tile once per filter tap, so a prologue fused on the image
(SBR's scale + bias + relu of a training-mode batchnorm) runs R*S times on every element, in the
registers of the tensor-core loop; conv_fprop loads the filter tile once per output tile, so a prologue
on the filter (a float32 weight cast to bf16 in a mixed-precision step) runs once per row tile of the
output. The pass variant runs the prologue once, as the pointwise template's kernel writing the conv's
operand into the step's scratch memory, then the template's plain kernel over it: two launches of one
step, the piece and its fusion unchanged (another engine may still take the fused piece whole). On the
GPU a conv with more than one tap, or a filter prologue, tries the pass variants first (the preference
PROLOGUE_PASS_FIRST, preferences.py: a fused 3x3 SBR wgrad took about twice the plain one; ViT-B/16's
patch embedding with its weight cast fused about four times: bench/results/constants.md#patch-convolutions); the
tuner times both kinds. The image's prologue is the one run apart where both operands have one.
"""

from __future__ import annotations

from functools import cached_property

from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.piece import make_piece
from ....memory.workspace import align_up
from ..gemm import Strategy, TileMatch
from ..gemm.tuning import BANDWIDTH
from ..knobs import TileKnobs
from .base import Arg, ArgKind, Generated, Launch, Match
from .pointwise import PointwiseTemplate
from .preferences import PROLOGUE_PASS_FIRST

KNOB = "PROLOGUE_PASS"
TEMPLATES = ("conv_fprop", "conv_wgrad")  # the templates whose candidates offer it
_POINTWISE = PointwiseTemplate()
_KERNEL = "kernel_prologue_pass"  # (the loader jits the functions named kernel*)
_PASS_CONFIGS = 3  # the plain conv's best configs offered with the pass
_IMAGE_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


_ROLES = ("image", "weight")  # the operands whose prologue may run apart, in order of preference


class ProloguePass:
    """The strategy of PROLOGUE_PASS=1 configs: `first`, the pointwise template's match of the operand's
    prologue, writes the conv's operand `uid` (its `role`) into scratch; `rest`, the conv template's
    match of the piece without the prologue, reads it there."""

    def __init__(self, first: Match, rest: TileMatch, uid: int, role: str = "image") -> None:
        self.first, self.rest, self.uid, self.role = first, rest, uid, role

    @staticmethod
    def of(m: TileMatch) -> ProloguePass | None:
        """The pass of a conv match, or None where no operand (the image, else conv_fprop's filter) has a
        prologue the pointwise template and the conv template can run apart: none at all, one that reads
        a view computed in the piece (a slice of X), an operand type other than fp16 / bf16 / fp32 (fp8's
        padding loads are rewritten for buffers, not scratch)."""
        gp, piece = m.gp, m.piece
        roles = [r for r in _ROLES if r in gp.main.op.input_roles()]
        found = [
            (r, u)
            for r in roles
            if isinstance(u := gp.main.input(r), int)
            and gp.prologue.get(u)
            and piece.tensor(u).data_type in _IMAGE_TYPES
        ]
        if not found:
            return None
        role, uid = found[0]
        nodes = gp.prologue[uid]
        members = {id(n) for n in nodes}
        pre = make_piece(piece.graph, piece.index, list(nodes))
        rest = make_piece(piece.graph, piece.index, [n for n in piece.nodes if id(n) not in members])
        if tuple(pre.outputs) != (uid,) or not set(pre.inputs) <= set(piece.inputs):
            return None
        first = _POINTWISE.match(pre, m.device)
        rest_gp, _ = m.template.analyze(rest)
        if not isinstance(first, Match) or rest_gp is None:
            return None
        return ProloguePass(first, m.template.match_class(m.template, rest_gp, m.device), uid, role)

    def offer(self, configs: list[TileKnobs], taps: int) -> list[TileKnobs]:
        """`configs` (the fused kernel's, the heuristic's first) with the pass variants: the plain conv's best
        configs with PROLOGUE_PASS=1, first on the GPU when the filter has more than one tap or the prologue
        is the filter's, otherwise before the last fused one (the broadest, FALLBACK's pick, stays last; the
        tuner and the tests reach them)."""
        cuda = self.rest.device.is_cuda
        passes = [c.replace(PROLOGUE_PASS=1) for c in self.rest.candidates()[: _PASS_CONFIGS if cuda else 1]]
        first = cuda and (taps > 1 or self.role == "weight")
        return PROLOGUE_PASS_FIRST.apply(configs, passes, 0 if first else -1)

    def cost(self, k: TileKnobs) -> float | None:
        """The plain kernel's estimate plus the pass: the prologue's inputs read and the conv input written
        once, at the bandwidth the GEMM estimates assume."""
        plain = self.rest.estimate(k.replace(PROLOGUE_PASS=None))
        if plain is None:
            return None
        pre = self.first.piece
        moved = sum(pre.tensor(u).nbytes for u in (*pre.inputs, *pre.outputs))
        return plain + moved / BANDWIDTH * 1e6 + 3.0

    def kernels(self, k: TileKnobs) -> Generated:
        """The pointwise pass writing the conv's input into scratch (after the kernel's own scratch), then
        the template's kernel reading it there."""
        main = self.rest.generate(k.replace(PROLOGUE_PASS=None))
        first = self.first.generate(self.first.candidates()[0])
        assert first.scratch_bytes == 0 and all(l.kernel == "kernel" for l in first.launches)
        offset = align_up(main.scratch_bytes)
        desc = self.rest.piece.tensor(self.uid)
        into = Arg(ArgKind.SCRATCH, offset=offset, dtype=str(desc.data_type.to_torch()).replace("torch.", ""))

        def redirect(launch: Launch, kernel: str) -> Launch:
            args = tuple(into if a.kind == ArgKind.BUF and a.uid == self.uid else a for a in launch.args)
            return Launch(kernel, launch.grid, args, launch.meta)

        source = first.source.replace("def kernel(", f"def {_KERNEL}(", 1)
        return Generated(
            source + "\n" + main.source,
            tuple(redirect(l, _KERNEL) for l in first.launches) + tuple(redirect(l, l.kernel) for l in main.launches),
            offset + align_up(desc.nbytes),
            first.notes | main.notes,
        )


class OffersProloguePass(TileMatch):
    """A conv template's match (conv_fprop, conv_wgrad) with PROLOGUE_PASS configs: the pass
    (`prologue_pass`, found once), its variants among the candidates, and the strategy of a config that
    asks for it."""

    @cached_property
    def prologue_pass(self) -> ProloguePass | None:
        return ProloguePass.of(self)

    def offer_prologue_pass(self, configs: list[TileKnobs], taps: int) -> list[TileKnobs]:
        found = self.prologue_pass
        return configs if found is None else found.offer(configs, taps)

    def strategy(self, k: TileKnobs) -> Strategy:
        if not k.prologue_pass:
            return self
        found = self.prologue_pass
        if found is None:
            raise AttributeValueError(
                f"{KNOB}=1 needs a pointwise prologue on the image (or filter) of {self.gp.main.label()} "
                "that can run apart (on fp16, bf16 or fp32 values, reading no view of the "
                "piece)",
                op=self.gp.main.label(),
                rule="triton.conv.prologue_pass",
                hint=f"drop {KNOB} (this piece's operands have no prologue to run apart)",
            )
        return found
