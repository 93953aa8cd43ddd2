"""The fused eval kernel: a group of 16 keys walks every level with its state in vector registers.

Private; see `fss.backend` for the public switch and `fss.tree` for the portable twin, which must
agree bit for bit (the tests run every vector and property on both).

Keys come in the grouped layout of `KeyBatch`: one group's seeds, corrections of every level and
payloads are contiguous, so a group's walk streams through memory. Per level, for the 16 keys of a
group (two halves of 8, each field an <8 x i64> vector, struct of arrays):
  d      = bit of x at this level
  blocks = seed block (s xor T(LEFT + d, 0)), then for a DCF the ceil(width/2) value blocks holding
           child d's payload words (s xor T(VALUE, first(d) + q)), interleaved into AES lanes
  AES    = one MMO over all blocks (512-bit VAES, 4 blocks per instruction, or 128-bit AES-NI)
  update = the same branch-free bookkeeping as `_kernels.eval_level`, with masks from t
The level loop is an IR loop whose state lives in SSA phis, so nothing is stored between levels.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _aes as A
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_VALUE

GROUP = 16
HALVES = GROUP // 8


class _Ptr:
    """Element pointers into a C-contiguous numba array argument; `n` is its last dimension and
    `group` the number of elements per index of its first dimension (one group of keys)."""

    def __init__(self, context, builder, aty, value):
        arr = context.make_array(aty)(context, builder, value)
        self.b, self.data = builder, arr.data
        shape = cgutils.unpack_tuple(builder, arr.shape)
        self.n = shape[-1]
        self.group = ir.Constant(A.I64, 1)
        for dim in shape[1:]:
            self.group = builder.mul(self.group, dim)

    def at(self, offset: ir.Value) -> ir.Value:
        return self.b.gep(self.data, [offset])

    def load8(self, offset: ir.Value) -> ir.Value:
        p = self.b.bitcast(self.at(offset), ir.VectorType(self.data.type.pointee, 8).as_pointer())
        v = self.b.load(p, align=1)
        return v if v.type == A.V8 else self.b.zext(v, A.V8)

    def store8(self, offset: ir.Value, value: ir.Value) -> None:
        vt = ir.VectorType(self.data.type.pointee, 8)
        if vt != A.V8:
            value = self.b.trunc(value, vt)
        self.b.store(value, self.b.bitcast(self.at(offset), vt.as_pointer()), align=1)


def _off(b: ir.IRBuilder, *terms: ir.Value) -> ir.Value:
    acc = terms[0]
    for t in terms[1:]:
        acc = b.add(acc, t)
    return acc


def _c64(v: int) -> ir.Constant:
    return ir.Constant(A.I64, v)


def _level_loop(b: ir.IRBuilder, count: ir.Value, state: list, body) -> list:
    """Emits `for i in range(count)` (count >= 1) carrying `state` (vectors) in phis; body(i, state)
    returns the next state. Returns the final state, usable after the loop."""
    entry = b.block
    loop = b.append_basic_block("level")
    done = b.append_basic_block("after")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(A.I64)
    i.add_incoming(_c64(0), entry)
    phis = []
    for v in state:
        ph = b.phi(v.type)
        ph.add_incoming(v, entry)
        phis.append(ph)
    new_state = body(i, phis)
    i_next = b.add(i, _c64(1))
    i.add_incoming(i_next, b.block)
    for ph, v in zip(phis, new_state):
        ph.add_incoming(v, b.block)
    b.cbranch(b.icmp_signed("<", i_next, count), loop, done)
    b.position_at_end(done)
    return new_state


def _words(b: ir.IRBuilder, regs: list) -> list:
    """MMO output registers (pairs of interleaved block registers) -> list of 64-bit word vectors,
    two per block: [block0 lo, block0 hi, block1 lo, ...]."""
    out = []
    for q in range(0, len(regs), 2):
        out += A.deinterleave(b, regs[q], regs[q + 1])
    return out


def _convert(b: ir.IRBuilder, aes, width: int, slo: ir.Value, shi: ir.Value) -> list:
    """Convert(leaf seed) for 8 keys: the high word for width 1, else the LEAF blocks' words."""
    if width == 1:
        return [shi]
    hl = b.xor(shi, A.const8(ROLE_LEAF))
    regs = []
    for q in range((width + 1) // 2):
        regs += A.interleave(b, b.xor(slo, A.const8(q)), hl)
    return _words(b, aes.mmo(regs))[:width]


@functools.lru_cache(maxsize=None)
def eval_group(width: int, has_v: bool, uniform_x: bool, vaes: bool):
    """The intrinsic eval16(seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, out_k):
    out[e, out_k + j] = share of key 16 g + j at its point (xs[16 g + j], or xs[0] if uniform_x),
    for j in 0..15 (a padded lane gives garbage, never a fault: it stays inside the group)."""
    nvb = (width + 1) // 2

    @intrinsic
    def eval16(typingctx, seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, out_k):
        i64 = types.int64
        sig = types.void(seeds, cw_seed, cw_t, cw_v, xs, i64, i64, i64, types.uint64, rk, out, i64)

        def codegen(context, builder, signature, args):
            b = builder
            aty = signature.args
            S, CS, CT, CV, X = (_Ptr(context, b, aty[j], args[j]) for j in range(5))
            g_, party_, bits_, mask_ = args[5], args[6], args[7], args[8]
            R = _Ptr(context, b, aty[9], args[9])
            O = _Ptr(context, b, aty[10], args[10])
            out_k_ = args[11]
            c64 = lambda v: ir.Constant(A.I64, v)  # noqa: E731
            k_ = b.mul(g_, c64(GROUP))  # first key of the group: its index into xs
            s0, cs0, ct0, cv0 = (b.mul(g_, P.group) for P in (S, CS, CT, CV))  # group bases
            aes = A.AesRounds(b, R.data, vaes)
            one, zero = A.const8(1), A.const8(0)

            def off(*terms):  # sum of i64 terms
                acc = terms[0]
                for t in terms[1:]:
                    acc = b.add(acc, t)
                return acc

            # initial state
            state = []
            for h in range(HALVES):
                state += [S.load8(off(s0, c64(8 * h))), S.load8(off(s0, c64(16 + 8 * h))), A.splat(b, party_)]
                state += [zero] * (width if has_v else 0)
            x_uniform = A.splat(b, b.load(X.at(c64(0)))) if uniform_x else None
            per_half = 3 + (width if has_v else 0)

            entry = b.block
            loop = b.append_basic_block("level")
            done = b.append_basic_block("leaf")
            b.branch(loop)
            b.position_at_end(loop)
            i = b.phi(A.I64)
            i.add_incoming(c64(0), entry)
            phis = []
            for v in state:
                ph = b.phi(A.V8)
                ph.add_incoming(v, entry)
                phis.append(ph)

            sh = A.splat(b, b.sub(b.sub(bits_, c64(1)), i))
            level_lo = off(cs0, b.mul(i, c64(2 * GROUP)))  # cw_seed[g, i, 0, :]
            level_t = off(ct0, b.mul(i, c64(GROUP)))  # cw_t[g, i, :]
            new_state = []
            # 1. PRG inputs for both halves
            regs, ds = [], []
            for h in range(HALVES):
                slo, shi = phis[per_half * h], phis[per_half * h + 1]
                x = x_uniform if uniform_x else X.load8(off(k_, c64(8 * h)))
                d = b.and_(b.lshr(x, sh), one)
                ds.append(d)
                regs += A.interleave(b, slo, b.xor(shi, b.add(d, A.const8(ROLE_LEFT))))
                if has_v:
                    first = b.lshr(b.mul(d, A.const8(width)), one)
                    hv = b.xor(shi, A.const8(ROLE_VALUE))
                    for q in range(nvb):
                        regs += A.interleave(b, b.xor(slo, b.add(first, A.const8(q))), hv)
            # 2. AES
            regs = aes.mmo(regs)
            per_regs = 2 * (1 + (nvb if has_v else 0))
            # 3. bookkeeping
            for h in range(HALVES):
                base = phis[per_half * h : per_half * (h + 1)]
                t = base[2]
                d = ds[h]
                mine = regs[per_regs * h : per_regs * (h + 1)]
                so, sho = A.deinterleave(b, mine[0], mine[1])
                lane = c64(8 * h)
                tm = b.sub(zero, t)
                ct = CT.load8(off(level_t, lane))
                tn = b.xor(b.and_(so, one), b.and_(b.lshr(ct, d), t))
                slo2 = b.xor(b.and_(so, A.const8(~1 & (2**64 - 1))), b.and_(CS.load8(off(level_lo, lane)), tm))
                shi2 = b.xor(sho, b.and_(CS.load8(off(level_lo, c64(GROUP), lane)), tm))
                accs = []
                if has_v:
                    words = [A.deinterleave(b, mine[2 + 2 * q], mine[3 + 2 * q]) for q in range(nvb)]
                    word = lambda wi: words[wi >> 1][wi & 1]  # noqa: E731
                    odd_side = b.icmp_unsigned("!=", d, zero)
                    for e in range(width):
                        val = word(e) if width % 2 == 0 else b.select(odd_side, word(e + 1), word(e))
                        cv = CV.load8(off(cv0, b.mul(b.add(b.mul(i, c64(width)), c64(e)), c64(GROUP)), lane))
                        accs.append(b.add(base[3 + e], b.add(val, b.and_(cv, tm))))
                new_state += [slo2, shi2, tn] + accs
            i_next = b.add(i, c64(1))
            i.add_incoming(i_next, b.block)
            for ph, v in zip(phis, new_state):
                ph.add_incoming(v, b.block)
            b.cbranch(b.icmp_signed("<", i_next, bits_), loop, done)

            # leaf: Convert(s) + t * CW_{n+1}, signed by the party, masked
            b.position_at_end(done)
            negate = b.icmp_signed("!=", party_, c64(0))
            last = b.mul(bits_, c64(width)) if has_v else c64(0)
            for h in range(HALVES):
                slo, shi, t = new_state[per_half * h : per_half * h + 3]
                accs = new_state[per_half * h + 3 : per_half * (h + 1)] or [zero] * width
                lane = c64(8 * h)
                tm = b.sub(zero, t)
                if width == 1:
                    conv = [shi]
                else:
                    hl = b.xor(shi, A.const8(ROLE_LEAF))
                    blocks = []
                    for q in range(nvb):
                        blocks += A.interleave(b, b.xor(slo, A.const8(q)), hl)
                    blocks = aes.mmo(blocks)
                    words = [A.deinterleave(b, blocks[2 * q], blocks[2 * q + 1]) for q in range(nvb)]
                    conv = [words[e >> 1][e & 1] for e in range(width)]
                for e in range(width):
                    cv = CV.load8(off(cv0, b.mul(b.add(last, c64(e)), c64(GROUP)), lane))
                    v = b.add(b.add(accs[e], conv[e]), b.and_(cv, tm))
                    v = b.select(negate, b.sub(zero, v), v)
                    O.store8(off(b.mul(c64(e), O.n), out_k_, c64(8 * h)), b.and_(v, A.splat(b, mask_)))
            return context.get_dummy_value()

        return sig, codegen

    return eval16


@functools.lru_cache(maxsize=None)
def gen_group(width: int, has_v: bool, vaes: bool):
    """The intrinsic gen16(alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v):
    both parties' correction words for the 16 key pairs of group g (BCG+21 Fig. 1), written into the
    grouped arrays. alphas (n_pad,) internal; betas (width, n_pad); roots (2 parties, 2 words, n_pad);
    below / equal: all-ones or zero masks that switch beta on for x < alpha and x == alpha."""

    @intrinsic
    def gen16(typingctx, alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v):
        u64, i64 = types.uint64, types.int64
        sig = types.void(alphas, betas, roots, i64, i64, u64, u64, u64, rk, cw_seed, cw_t, cw_v)

        def codegen(context, builder, signature, args):
            b = builder
            aty = signature.args
            AL, BE, RO = (_Ptr(context, b, aty[j], args[j]) for j in range(3))
            g_, bits_, mask_, below_, equal_ = args[3:8]
            R = _Ptr(context, b, aty[8], args[8])
            CS, CT, CV = (_Ptr(context, b, aty[j], args[j]) for j in (9, 10, 11))
            aes = A.AesRounds(b, R.data, vaes)
            one, zero = A.const8(1), A.const8(0)
            not1 = A.const8(~1 & (2**64 - 1))
            n_pad = AL.n
            k_ = b.mul(g_, _c64(GROUP))
            cs0, ct0, cv0 = (b.mul(g_, P.group) for P in (CS, CT, CV))
            m_below, m_equal = A.splat(b, below_), A.splat(b, equal_)

            def beta(e, h):
                return BE.load8(_off(b, b.mul(_c64(e), n_pad), k_, _c64(8 * h)))

            state = []  # per half: s0 lo, s0 hi, s1 lo, s1 hi, t0, t1, v_alpha[width]
            for h in range(HALVES):
                kh = _off(b, k_, _c64(8 * h))
                state += [RO.load8(_off(b, b.mul(_c64(r), n_pad), kh)) for r in range(4)]
                state += [zero, one] + [zero] * (width if has_v else 0)
            per_half = 6 + (width if has_v else 0)

            def level(i, st):
                sh = A.splat(b, b.sub(b.sub(bits_, _c64(1)), i))
                new = []
                for h in range(HALVES):
                    s0lo, s0hi, s1lo, s1hi, t0, t1 = st[per_half * h : per_half * h + 6]
                    va = st[per_half * h + 6 : per_half * (h + 1)]
                    lane = _c64(8 * h)
                    a = b.and_(b.lshr(AL.load8(_off(b, k_, lane)), sh), one)
                    keep = b.icmp_unsigned("!=", a, zero)  # alpha bit 1: keep right, lose left
                    kids = []  # per party: words of LEFT, RIGHT, VALUE 0.. blocks
                    for slo, shi in ((s0lo, s0hi), (s1lo, s1hi)):
                        regs = A.interleave(b, slo, b.xor(shi, A.const8(ROLE_LEFT)))
                        regs += A.interleave(b, slo, b.xor(shi, A.const8(ROLE_LEFT + 1)))
                        if has_v:
                            hv = b.xor(shi, A.const8(ROLE_VALUE))
                            for j in range(width):
                                regs += A.interleave(b, b.xor(slo, A.const8(j)), hv)
                        kids.append(_words(b, aes.mmo(regs)))
                    sel = lambda if_keep_right, otherwise: b.select(keep, if_keep_right, otherwise)  # noqa: E731
                    # seed and control-bit corrections from the lost child
                    lose_lo = [sel(kw[0], kw[2]) for kw in kids]
                    lose_hi = [sel(kw[1], kw[3]) for kw in kids]
                    cw_lo = b.and_(b.xor(lose_lo[0], lose_lo[1]), not1)
                    cw_hi = b.xor(lose_hi[0], lose_hi[1])
                    tl = b.xor(b.xor(b.and_(kids[0][0], one), b.and_(kids[1][0], one)), b.xor(a, one))
                    tr = b.xor(b.xor(b.and_(kids[0][2], one), b.and_(kids[1][2], one)), a)
                    level_cs = _off(b, cs0, b.mul(i, _c64(2 * GROUP)), lane)
                    CS.store8(level_cs, cw_lo)
                    CS.store8(_off(b, level_cs, _c64(GROUP)), cw_hi)
                    CT.store8(_off(b, ct0, b.mul(i, _c64(GROUP)), lane), b.or_(tl, b.shl(tr, one)))
                    t_keep = sel(tr, tl)
                    # payload corrections
                    new_va = []
                    if has_v:
                        negate = b.icmp_unsigned("!=", t1, zero)
                        for e in range(width):
                            word = lambda kw, m: kw[4 + m]  # noqa: E731  value word m of a party
                            v_lose = [sel(word(kw, e), word(kw, width + e)) for kw in kids]
                            v_keep = [sel(word(kw, width + e), word(kw, e)) for kw in kids]
                            add_beta = b.and_(b.and_(beta(e, h), m_below), b.sub(zero, a))  # lose == left
                            base = b.add(b.sub(b.sub(v_lose[1], v_lose[0]), va[e]), add_beta)
                            vcw = b.select(negate, b.sub(zero, base), base)
                            CV.store8(_off(b, cv0, b.mul(b.add(b.mul(i, _c64(width)), _c64(e)), _c64(GROUP)), lane),
                                      b.and_(vcw, A.splat(b, mask_)))
                            new_va.append(b.add(va[e], b.add(b.sub(v_keep[0], v_keep[1]), base)))
                    # advance both parties along alpha
                    nxt = []
                    for kw, t in zip(kids, (t0, t1)):
                        klo, khi = sel(kw[2], kw[0]), sel(kw[3], kw[1])
                        tm = b.sub(zero, t)
                        nxt.append((b.xor(b.and_(klo, not1), b.and_(cw_lo, tm)), b.xor(khi, b.and_(cw_hi, tm)),
                                    b.xor(b.and_(klo, one), b.and_(t_keep, t))))
                    new += [nxt[0][0], nxt[0][1], nxt[1][0], nxt[1][1], nxt[0][2], nxt[1][2]] + new_va
                return new

            final = _level_loop(b, bits_, state, level)
            last = b.mul(bits_, _c64(width)) if has_v else _c64(0)
            for h in range(HALVES):
                s0lo, s0hi, s1lo, s1hi, t0, t1 = final[per_half * h : per_half * h + 6]
                va = final[per_half * h + 6 : per_half * (h + 1)] or [zero] * width
                lane = _c64(8 * h)
                c0, c1 = _convert(b, aes, width, s0lo, s0hi), _convert(b, aes, width, s1lo, s1hi)
                negate = b.icmp_unsigned("!=", t1, zero)
                for e in range(width):
                    base = b.add(b.sub(b.sub(c1[e], c0[e]), va[e]), b.and_(beta(e, h), m_equal))
                    cw = b.select(negate, b.sub(zero, base), base)
                    CV.store8(_off(b, cv0, b.mul(b.add(last, _c64(e)), _c64(GROUP)), lane), b.and_(cw, A.splat(b, mask_)))
            return context.get_dummy_value()

        return sig, codegen

    return gen16
