"""The fused eval kernel: a group of `GROUP` (16) keys walks from its roots to the leaves at one point
per key, the state of every level in vector registers (see `fss._fused` for the layout, the other
kernels and the helpers shared with them).

Private. Per level, for each half of 8 keys (one <8 x i64> vector per field; struct of arrays):
  d      = bit of x at this level
  blocks = seed block (s xor T(LEFT + d, 0)), then for a DCF the ceil(width/2) value blocks holding
           child d's payload words (s xor T(VALUE, first(d) + q)), interleaved into AES lanes
  AES    = one MMO over all blocks (`fss._aes.AesRounds`)
  update = the same branch-free bookkeeping as `_kernels.eval_level`, with masks from t
(`fss._fused`'s `_one_child_blocks`, `_one_child_values` and `_Group`), bit for bit the same values.

The level loop also prefetches the corrections of the group `PREFETCH_AHEAD` groups ahead at the same
level (every cache line of its seed and payload corrections), and a group's start that group's points,
roots and control-bit corrections: with keys far larger than the caches, the CPU's own prefetchers
left the walk waiting on memory. A DCF(32, 64, 1) key is 824 bytes, so at 200,000 keys the eval
streams 8-10 GB/s from DRAM, about what one core of the Zen 3 class EPYC reads at all (9.6 GB/s for a
plain numba loop over 160 MB, load average 5.8): there the walk is close to memory-bound.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _aes as A
from ._fused import HALVES, _Group, _one_child_blocks, _one_child_values, _Ptr, _c64, _level_loop, _off, _words
from .keys import GROUP

PREFETCH_AHEAD = 2  # groups: one group's walk (about 2 us) covers the memory latency many times over


def _prefetch(b: ir.IRBuilder, P: _Ptr, offset: ir.Value) -> None:
    """A read prefetch of the cache line of element `offset` of P (never faults, even past the end)."""
    i8p = ir.IntType(8).as_pointer()
    try:
        fn = b.module.get_global("llvm.prefetch.p0")
    except KeyError:
        fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), [i8p, A.I32, A.I32, A.I32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(P.at(offset), i8p), ir.Constant(A.I32, 0), ir.Constant(A.I32, 3), ir.Constant(A.I32, 1)])


@functools.lru_cache(maxsize=None)
def eval_group(width: int, has_v: bool, uniform_x: bool, tier: str):
    """The intrinsic eval16(seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, out_k):
    out[e, out_k + j] = share e of key GROUP g + j at its point (xs[GROUP g + j], or xs[0] if
    uniform_x), for j in 0..15, payload element e < width. seeds (G, 2, 16), cw_seed (G, bits, 2, 16),
    cw_t (G, bits, 16), cw_v (G, v_levels, width, 16): a `KeyBatch`'s grouped arrays; xs (n_pad,)
    or (1,) uint64 internal points; out (width, m) uint64. A padded lane gives garbage, never a
    fault: it stays inside the group."""
    nwords = 2 * (1 + ((width + 1) // 2 if has_v else 0))  # words per key per level

    @intrinsic
    def eval16(typingctx, seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, out_k):
        i64 = types.int64
        sig = types.void(seeds, cw_seed, cw_t, cw_v, xs, i64, i64, i64, types.uint64, rk, out, i64)

        def codegen(context, b, signature, args):
            aty = signature.args
            S, X = _Ptr(context, b, aty[0], args[0]), _Ptr(context, b, aty[4], args[4])
            grp = _Group(b, context, aty[1:4], args[1:4], args[5], width, has_v)
            g_, party_, bits_, mask_ = args[5], args[6], args[7], args[8]
            aes = A.AesRounds(b, _Ptr(context, b, aty[9], args[9]).data, tier)
            O, out_k_ = _Ptr(context, b, aty[10], args[10]), args[11]
            k_ = b.mul(g_, _c64(GROUP))  # the group's first key: its index into xs
            s0 = b.mul(g_, S.group)
            zero, one = A.const8(0), A.const8(1)
            # the group PREFETCH_AHEAD ahead: its points, roots and control-bit corrections (at most
            # 64 levels of 16 bytes: 16 cache lines, those past its `bits` levels guarded to line 0)
            ahead = _c64(PREFETCH_AHEAD)
            for q in range(0, 0 if uniform_x else GROUP, 8):
                _prefetch(b, X, _off(b, k_, _c64(PREFETCH_AHEAD * GROUP + q)))
            for q in range(0, 2 * GROUP, 8):
                _prefetch(b, S, _off(b, s0, b.mul(ahead, S.group), _c64(q)))
            ct_next, ct_size = _off(b, grp.ct0, b.mul(ahead, grp.CT.group)), b.mul(bits_, _c64(GROUP))
            for q in range(0, 64 * GROUP, 64):
                _prefetch(b, grp.CT, _off(b, ct_next, b.select(b.icmp_signed("<", _c64(q), ct_size), _c64(q), _c64(0))))
            x_uniform = A.splat(b, b.load(X.at(_c64(0)))) if uniform_x else None
            state = []  # per half: seed lo, seed hi, t, acc[width]
            for h in range(HALVES):
                state += [S.load8(_off(b, s0, _c64(8 * h))), S.load8(_off(b, s0, _c64(GROUP + 8 * h))), A.splat(b, party_)]
                state += [zero] * width
            per = 3 + width
            cv_line = 64 // (grp.CV.data.type.pointee.width // 8)  # payload corrections per cache line

            def level(i, st):
                cs = _off(b, grp.cs0, b.mul(ahead, grp.CS.group), b.mul(i, _c64(2 * GROUP)))
                for q in range(0, 2 * GROUP, 8):
                    _prefetch(b, grp.CS, _off(b, cs, _c64(q)))
                if has_v:
                    cv = _off(b, grp.cv0, b.mul(ahead, grp.CV.group), b.mul(i, _c64(width * GROUP)))
                    for q in range(0, width * GROUP, cv_line):
                        _prefetch(b, grp.CV, _off(b, cv, _c64(q)))
                sh = A.splat(b, b.sub(b.sub(bits_, _c64(1)), i))
                ds, regs = [], []
                for h in range(HALVES):
                    x = x_uniform if uniform_x else X.load8(_off(b, k_, _c64(8 * h)))
                    ds.append(b.and_(b.lshr(x, sh), one))
                    regs += _one_child_blocks(b, st[per * h], st[per * h + 1], ds[h], width, has_v)
                words = _words(b, aes.mmo(regs))
                new = []
                for h in range(HALVES):
                    t, accs = st[per * h + 2], st[per * h + 3 : per * (h + 1)]
                    mine = words[nwords * h : nwords * (h + 1)]
                    new += grp.advance(i, h, mine[0], mine[1], t, ds[h])
                    if has_v:
                        accs = grp.add_payload(i, h, accs, _one_child_values(b, mine[2:], ds[h], width), t)
                    new += accs
                return new

            final = _level_loop(b, bits_, state, level)
            for h in range(HALVES):
                slo, shi, t = final[per * h : per * h + 3]
                outs = grp.leaf(aes, h, slo, shi, t, final[per * h + 3 : per * (h + 1)], bits_, party_, mask_)
                for e, v in enumerate(outs):
                    O.store8(_off(b, b.mul(_c64(e), O.n), out_k_, _c64(8 * h)), v)
            return context.get_dummy_value()

        return sig, codegen

    return eval16
