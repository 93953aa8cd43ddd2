"""The fused eval kernel: a group of `GROUP` (16) keys walks from its roots to the leaves at one point
per key, the state of every level in vector registers (see `fss._fused` for the layout, the other
kernels and the helpers shared with them).

Private. Per level, for each half of 8 keys (one <8 x i64> vector per field; struct of arrays):
  state  = seed lo, seed hi, t as a mask (all ones or zero), x shifted so that this level's bit is
           its sign bit, the payload accumulators
  dm     = x >> 63 (arithmetic): all ones where the bit is 1 (AVX2: one `vpcmpgtq` against zero)
  blocks = seed block (s xor T(LEFT + d, 0)), then for a DCF the ceil(width/2) value blocks of child
           d's payload words, interleaved into AES lanes; one MMO over all of them
  update = seed corrections and payload share masked by t; the next t mask is
           -(bit 0 of the child seed) xor [(cw_t and (1 - dm) and t) > 0], i.e. bit d of the level's
           control-bit correction where t is set; for odd widths the child's word is chosen by
           w0 xor ((w0 xor w1) and dm); then x += x.
The same values as `fss._kernels.eval_level`, bit for bit. On the AVX2 tiers a vector shift,
variable shift, `vpcmpeqq` or `vblendvpd` takes an execution port that the AES instructions need
(Zen 3: a loop of 8 registers' VAES rounds ran 1.7-2.3x as long with as many of those as AES
instructions in between, about 1.05x with as many `vpand`/`vpxor`/`vpaddq`/`vpcmpgtq`), so the level's
bit, the t update and the word choice use only the latter (the choice still becomes one
`vpblendvb`: hiding the mask from LLVM to avoid it spilled more and ran slower).

The level loop also prefetches the corrections of the group `PREFETCH_AHEAD` groups ahead at the same
level (every cache line of its seed and payload corrections): with keys far larger than the caches,
the CPU's own prefetchers left the walk waiting on memory.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _aes as A
from ._fused import HALVES, _Group, _Ptr, _c64, _level_loop, _off, _words
from .keys import GROUP
from .prg import ROLE_LEFT, ROLE_VALUE

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
            up = A.splat(b, b.sub(_c64(64), bits_))  # x << (64 - bits): the root's bit in the sign
            state = []  # per half: seed lo, seed hi, t mask, x, acc[width]
            for h in range(HALVES):
                x = A.splat(b, b.load(X.at(_c64(0)))) if uniform_x else X.load8(_off(b, k_, _c64(8 * h)))
                state += [S.load8(_off(b, s0, _c64(8 * h))), S.load8(_off(b, s0, _c64(GROUP + 8 * h)))]
                state += [b.sub(zero, A.splat(b, party_)), b.shl(x, up)] + [zero] * width
            per = 4 + width
            ahead = _c64(PREFETCH_AHEAD)
            cv_line = 64 // (grp.CV.data.type.pointee.width // 8)  # payload corrections per cache line

            def level(i, st):
                cs = _off(b, grp.cs0, b.mul(ahead, grp.CS.group), b.mul(i, _c64(2 * GROUP)))
                for q in range(0, 2 * GROUP, 8):
                    _prefetch(b, grp.CS, _off(b, cs, _c64(q)))
                if has_v:
                    cv = _off(b, grp.cv0, b.mul(ahead, grp.CV.group), b.mul(i, _c64(width * GROUP)))
                    for q in range(0, width * GROUP, cv_line):
                        _prefetch(b, grp.CV, _off(b, cv, _c64(q)))
                dms, regs = [], []
                for h in range(HALVES):
                    slo, shi, xr = st[per * h], st[per * h + 1], st[per * h + 3]
                    dm = b.ashr(xr, A.const8(63))  # all ones where this level's bit of x is 1
                    dms.append(dm)
                    regs += A.interleave(b, slo, b.xor(shi, b.sub(A.const8(ROLE_LEFT), dm)))  # LEFT + d
                    if has_v:
                        first = b.lshr(b.mul(b.sub(zero, dm), A.const8(width)), one)  # d * width // 2
                        hv = b.xor(shi, A.const8(ROLE_VALUE))
                        for q in range((width + 1) // 2):
                            regs += A.interleave(b, b.xor(slo, b.add(first, A.const8(q))), hv)
                words = _words(b, aes.mmo(regs))
                new = []
                for h in range(HALVES):
                    tm, xr, accs = st[per * h + 2], st[per * h + 3], st[per * h + 4 : per * (h + 1)]
                    mine, dm, lane = words[nwords * h : nwords * (h + 1)], dms[h], _c64(8 * h)
                    so, sho = mine[0], mine[1]
                    lo = _off(b, grp.cs0, b.mul(i, _c64(2 * GROUP)), lane)
                    new.append(b.xor(b.and_(so, A.const8(~1 & (2**64 - 1))), b.and_(grp.CS.load8(lo), tm)))
                    new.append(b.xor(sho, b.and_(grp.CS.load8(_off(b, lo, _c64(GROUP))), tm)))
                    ct = grp.CT.load8(_off(b, grp.ct0, b.mul(i, _c64(GROUP)), lane))
                    hit = b.and_(b.and_(ct, b.sub(one, dm)), tm)  # cw_t's bit d (1 or 2) where t, else 0
                    flip = b.sext(b.icmp_signed(">", hit, zero), A.V8)
                    new += [b.xor(b.sub(zero, b.and_(so, one)), flip), b.add(xr, xr)]
                    if has_v:
                        vals = mine[2:]
                        if width % 2:  # child d's words start at word d of the first value block
                            vals = [b.xor(vals[e], b.and_(b.xor(vals[e], vals[e + 1]), dm)) for e in range(width)]
                        accs = [b.add(acc, b.add(v, b.and_(grp.payload(i, h, e), tm))) for e, (acc, v) in enumerate(zip(accs, vals))]
                    new += accs
                return new

            final = _level_loop(b, bits_, state, level)
            for h in range(HALVES):
                slo, shi, tm = final[per * h : per * h + 3]
                outs = grp.leaf(aes, h, slo, shi, b.sub(zero, tm), final[per * h + 4 : per * (h + 1)], bits_, party_, mask_)
                for e, v in enumerate(outs):
                    O.store8(_off(b, b.mul(_c64(e), O.n), out_k_, _c64(8 * h)), v)
            return context.get_dummy_value()

        return sig, codegen

    return eval16
