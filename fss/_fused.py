"""The fused kernels: a group of `GROUP` (16) keys walks every level with its state in vector registers.

Private; see `fss.backend` for the public switch and `fss.portable` for the level-by-level twin,
which must agree bit for bit (the tests run every vector and property on both). `fss.fast` wraps
these intrinsics in the parallel numba kernels it calls; the eval kernel (one point per key) is in
`fss._eval`, on the helpers here.

Keys come in the grouped layout of `KeyBatch`: one group's seeds, corrections of every level and
payloads are contiguous, so a group's walk streams through memory. Per level, for the 16 keys of a
group (two halves of 8, each field an <8 x i64> vector, struct of arrays):
  d      = bit of x at this level
  blocks = seed block (s xor T(LEFT + d, 0)), then for a DCF the ceil(width/2) value blocks holding
           child d's payload words (s xor T(VALUE, first(d) + q)), interleaved into AES lanes
  AES    = one MMO over all blocks (512-bit VAES, 4 blocks per instruction, or 128-bit AES-NI)
  update = the same branch-free bookkeeping as `_kernels.eval_level`, with masks from t
The level loop is an IR loop whose state lives in SSA phis, so nothing is stored between levels.

Array arguments are C-contiguous; `g` is a group index; `party` 0 or 1; `bits` the domain bits;
`mask` = 2^out_bits - 1; `rk` the (11, 2) uint64 round keys of `_aes.round_keys()`. The factories
take the compile-time choices (payload width, whether every level carries a payload (DCF) or only
the leaf (DPF), VAES or AES-NI) and are memoized, one intrinsic per choice.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _aes as A
from .keys import GROUP
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_VALUE

HALVES = GROUP // 8  # a group is walked as halves of 8 keys, one <8 x i64> vector per field


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
    out: list = []
    for q in range(0, len(regs), 2):
        out += A.deinterleave(b, regs[q], regs[q + 1])
    return out


def _convert(b: ir.IRBuilder, aes, width: int, slo: ir.Value, shi: ir.Value) -> list:
    """Convert(leaf seed) for 8 keys: the high word for width 1, else the LEAF blocks' words."""
    if width == 1:
        return [shi]
    hl = b.xor(shi, A.const8(ROLE_LEAF))
    regs: list = []
    for q in range((width + 1) // 2):
        regs += A.interleave(b, b.xor(slo, A.const8(q)), hl)
    return _words(b, aes.mmo(regs))[:width]


class _Group:
    """One group's correction words (grouped KeyBatch arrays) and the per-level tree math on them,
    for the half h (8 keys) of the group's 16 lanes."""

    def __init__(self, b, context, aty, args, g_, width: int, has_v: bool):
        self.b, self.width, self.has_v = b, width, has_v
        self.CS, self.CT, self.CV = (_Ptr(context, b, t, v) for t, v in zip(aty, args))
        self.cs0, self.ct0, self.cv0 = (b.mul(g_, P.group) for P in (self.CS, self.CT, self.CV))

    def advance(self, i, h, so, sho, t, d):
        """Child seed block (so, sho) -> the child's (seed lo, seed hi, t) after the corrections."""
        b = self.b
        one, zero, lane = A.const8(1), A.const8(0), _c64(8 * h)
        tm = b.sub(zero, t)
        lo = _off(b, self.cs0, b.mul(i, _c64(2 * GROUP)), lane)
        ct = self.CT.load8(_off(b, self.ct0, b.mul(i, _c64(GROUP)), lane))
        slo = b.xor(b.and_(so, A.const8(~1 & (2**64 - 1))), b.and_(self.CS.load8(lo), tm))
        shi = b.xor(sho, b.and_(self.CS.load8(_off(b, lo, _c64(GROUP))), tm))
        return slo, shi, b.xor(b.and_(so, one), b.and_(b.lshr(ct, d), t))

    def payload(self, level, h, e):
        """Payload correction element e of `level` for the half's 8 keys."""
        b = self.b
        row = b.add(b.mul(level, _c64(self.width)), _c64(e))
        return self.CV.load8(_off(b, self.cv0, b.mul(row, _c64(GROUP)), _c64(8 * h)))

    def add_payload(self, i, h, accs, vals, t):
        """acc[e] + v[e] + t * V_CW[e]: this level's payload share (the sign comes at the leaf)."""
        b = self.b
        tm = b.sub(A.const8(0), t)
        return [b.add(acc, b.add(v, b.and_(self.payload(i, h, e), tm))) for e, (acc, v) in enumerate(zip(accs, vals))]

    def leaf(self, aes, h, slo, shi, t, accs, bits_, party_, mask_):
        """(-1)^party (acc + Convert(s) + t * CW_{n+1}) masked, per payload element."""
        b = self.b
        zero = A.const8(0)
        tm = b.sub(zero, t)
        last = bits_ if self.has_v else _c64(0)
        conv = _convert(b, aes, self.width, slo, shi)
        negate = b.icmp_signed("!=", party_, _c64(0))
        out = []
        for e in range(self.width):
            v = b.add(b.add(accs[e], conv[e]), b.and_(self.payload(last, h, e), tm))
            out.append(b.and_(b.select(negate, b.sub(zero, v), v), A.splat(b, mask_)))
        return out


def _one_child_blocks(b, slo, shi, d, width: int, has_v: bool) -> list:
    """PRG input registers for child d of 8 seeds: its seed block, then (DCF) the value blocks that
    hold its payload words d*width .. d*width + width - 1."""
    regs = list(A.interleave(b, slo, b.xor(shi, b.add(d, A.const8(ROLE_LEFT)))))
    if has_v:
        first = b.lshr(b.mul(d, A.const8(width)), A.const8(1))
        hv = b.xor(shi, A.const8(ROLE_VALUE))
        for q in range((width + 1) // 2):
            regs += A.interleave(b, b.xor(slo, b.add(first, A.const8(q))), hv)
    return regs


def _one_child_values(b, words: list, d, width: int) -> list:
    """Child d's payload words among the words of `_one_child_blocks`' value blocks."""
    if width % 2 == 0:
        return words[:width]
    odd_side = b.icmp_unsigned("!=", d, A.const8(0))  # then its words start at an odd position
    return [b.select(odd_side, words[e + 1], words[e]) for e in range(width)]


def _both_children_blocks(b, slo, shi, width: int, has_v: bool) -> list:
    """PRG input registers that expand both children of 8 seeds: LEFT, RIGHT, VALUE 0..width-1."""
    regs = list(A.interleave(b, slo, b.xor(shi, A.const8(ROLE_LEFT))))
    regs += A.interleave(b, slo, b.xor(shi, A.const8(ROLE_LEFT + 1)))
    if has_v:
        hv = b.xor(shi, A.const8(ROLE_VALUE))
        for j in range(width):
            regs += A.interleave(b, b.xor(slo, A.const8(j)), hv)
    return regs


def _children(b, grp, aes, st: list, level, d, both: bool, width: int, has_v: bool) -> list:
    """The child d (or, with `both`, both children) of one node for the 16 keys of a group, from
    the node's state st[h] = [seed lo, seed hi, t, acc...] per half. Returns, per half, a list of
    (side, [seed lo, seed hi, t, acc...]) for the children computed."""
    regs = []
    for h in range(HALVES):
        make = _both_children_blocks(b, st[h][0], st[h][1], width, has_v) if both else \
            _one_child_blocks(b, st[h][0], st[h][1], d, width, has_v)
        regs += make
    words = _words(b, aes.mmo(regs))
    per = len(words) // HALVES
    out = []
    for h in range(HALVES):
        mine, kids = words[per * h : per * (h + 1)], []
        for side in ((0, 1) if both else (None,)):
            if side is not None:  # both children
                dd, seed = A.const8(side), mine[2 * side : 2 * side + 2]
                vals = mine[4 + side * width : 4 + (side + 1) * width]
            else:
                dd, seed = d, mine[0:2]
                vals = _one_child_values(b, mine[2:], d, width) if has_v else []
            node = list(grp.advance(level, h, seed[0], seed[1], st[h][2], dd))
            node += grp.add_payload(level, h, st[h][3:], vals, st[h][2]) if has_v else st[h][3:]
            kids.append((side, node))
        out.append(kids)
    return out


@functools.lru_cache(maxsize=None)
def trie_steps(width: int, has_v: bool, tier: str):
    """Intrinsics for walking one group's trees over a set of points (all 16 keys at the same node),
    returned as (step_one, step_both, last_one, last_both). A node's state is a slot of `state`
    (slots, 3 + width, 16) uint64: seed lo, seed hi, t, acc[width]. All four take the same arguments

        (state, src, a, b, d, level_or_lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, partial)

    step_one:  child d of slot src -> slot a (level_or_lanes = the node's level; b unused)
    step_both: both children of slot src -> slots a (left) and b (right) (d unused)
    last_one, last_both: the same at the last level (bits - 1), but the children are leaves: each
        leaf's share, summed over the first `level_or_lanes` keys of the group (the real ones), is
        added to partial[point * width + e], where point = a for the left child or the one child,
        b for the right child of last_both. partial: (points, width) uint64, one thread's row.
    party, bits and mask matter only to the last-level variants (the others ignore them).
    """
    rows = 3 + width
    i64 = types.int64

    def load(b, ST, slot, h):
        base = b.mul(slot, _c64(rows * GROUP))
        return [ST.load8(_off(b, base, _c64(r * GROUP + 8 * h))) for r in range(rows)]

    def store(b, ST, slot, h, values):
        base = b.mul(slot, _c64(rows * GROUP))
        for r, v in enumerate(values):
            ST.store8(_off(b, base, _c64(r * GROUP + 8 * h)), v)

    def reduce_into(b, P, point, e, v, lanes_, h):
        """partial[point * width + e] += the sum of v's lanes that are real keys (< lanes)."""
        idx = ir.Constant(A.V8, [8 * h + j for j in range(8)])
        v = b.select(b.icmp_signed("<", idx, A.splat(b, lanes_)), v, A.const8(0))
        ptr = P.at(_off(b, b.mul(point, _c64(width)), _c64(e)))
        b.store(b.add(b.load(ptr), b.call(A.declare_reduce(b), [v])), ptr)

    def variant(both: bool, last: bool):
        def typer(typingctx, state, src, a, b_, d, level_or_lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, partial):
            sig = types.void(state, i64, i64, i64, i64, i64, cw_seed, cw_t, cw_v, i64, i64, i64, types.uint64, rk, partial)

            def codegen(context, b, signature, args):
                aty = signature.args
                ST = _Ptr(context, b, aty[0], args[0])
                src_, a_, b2_, d_, lv_ = args[1:6]
                grp = _Group(b, context, aty[6:9], args[6:9], args[9], width, has_v)
                party_, bits_, mask_ = args[10:13]
                aes = A.AesRounds(b, _Ptr(context, b, aty[13], args[13]).data, tier)
                level = b.sub(bits_, _c64(1)) if last else lv_
                st = [load(b, ST, src_, h) for h in range(HALVES)]
                kids = _children(b, grp, aes, st, level, A.splat(b, d_), both, width, has_v)
                for h in range(HALVES):
                    for side, node in kids[h]:
                        target = b2_ if side == 1 else a_
                        if not last:
                            store(b, ST, target, h, node)
                            continue
                        P = _Ptr(context, b, aty[14], args[14])
                        for e, v in enumerate(grp.leaf(aes, h, node[0], node[1], node[2], node[3:], bits_, party_, mask_)):
                            reduce_into(b, P, target, e, v, lv_, h)
                return context.get_dummy_value()

            return sig, codegen

        return intrinsic(typer)

    return variant(False, False), variant(True, False), variant(False, True), variant(True, True)


@functools.lru_cache(maxsize=None)
def gen_group(width: int, has_v: bool, tier: str, halves: int = HALVES):
    """The intrinsic gen16(alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v):
    both parties' correction words for the 16 key pairs of group g (BCG+21 Fig. 1), written into the
    grouped arrays cw_seed (G, bits, 2, 16), cw_t (G, bits, 16), cw_v (G, v_levels, width, 16).
    alphas (n_pad,) internal; betas (width, n_pad); roots (2 parties, 2 words, n_pad), n_pad a
    multiple of 16; below / equal: all-ones or zero masks that switch beta on for x < alpha and
    x == alpha. `halves` 1: the group's first 8 keys alone, half the AES work (one key's gen,
    `fast._one_kernel`); the other lanes of the outputs are left as they are."""

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
            aes = A.AesRounds(b, R.data, tier)
            one, zero = A.const8(1), A.const8(0)
            not1 = A.const8(~1 & (2**64 - 1))
            n_pad = AL.n
            k_ = b.mul(g_, _c64(GROUP))
            cs0, ct0, cv0 = (b.mul(g_, P.group) for P in (CS, CT, CV))
            m_below, m_equal = A.splat(b, below_), A.splat(b, equal_)

            def beta(e, h):
                return BE.load8(_off(b, b.mul(_c64(e), n_pad), k_, _c64(8 * h)))

            state = []  # per half: s0 lo, s0 hi, s1 lo, s1 hi, t0, t1, v_alpha[width]
            for h in range(halves):
                kh = _off(b, k_, _c64(8 * h))
                state += [RO.load8(_off(b, b.mul(_c64(r), n_pad), kh)) for r in range(4)]
                state += [zero, one] + [zero] * (width if has_v else 0)
            per_half = 6 + (width if has_v else 0)

            def level(i, st):
                sh = A.splat(b, b.sub(b.sub(bits_, _c64(1)), i))
                new = []
                for h in range(halves):
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
            for h in range(halves):
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
