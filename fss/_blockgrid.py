"""The full-grid step over F_p for the 16-register tiers (256-bit VAES, 128-bit AES-NI) and an even
payload width (round one's keys: width 2), with the nodes in AES-block layout, so that no word moves
between the vectors of a level and the blocks the AES instructions take.

Private; `fss.fast.eval_grid` runs it where `fits` says, in place of `_grid.grid_step` (same
arguments, same contract), and `fss.portable.eval_grid` is the twin it must equal bit for bit. A node
is its seed block, with its control bit t in bit 0 of the low word (every seed but the root's has bit
0 zero, and so has every seed correction gen makes or the codec accepts: `fast.eval_grid` sends other
batches to the portable backend), and its width accumulators. Read flat, a node buffer (3 + width,
capacity) holds node k's block at words 2k, 2k + 1 and its accumulators at 3 capacity + width k.
Two blocks fill a 256-bit register, and one node's pair up without shuffles:

    [s ^ T(LEFT) | s ^ T(RIGHT)]                  -> [left child | right child]: seeds, t, stored as they are
    [s ^ T(VALUE, 2m + q) | s ^ T(VALUE, w + 2m + q)], q = 0, 1
                                                  -> [left acc 2m, 2m + 1 | right acc 2m, 2m + 1]
    leaf: [left ^ T(LEAF, q) | right ^ T(LEAF, q)] -> two leaves' shares, in the output's (leaf, element) order

The F_p arithmetic is `_grid`'s (part, half, lazy reduction), the share of party 1 is canonical(8p - x)
(x < 2^63 + 2^7, so 8p - x does not wrap). Against the `_grid` step in one process (thread time, 64 keys,
2^10 points, AMD EPYC Zen 3 class, load average 2.5-4): width 2 in round one's order (x >= alpha)
1.08-1.16x on vaes256 and 1.19-1.25x on aesni, width 4 1.23x; the forward order (x < alpha) 0.95x on
vaes256. Width 1 in node pairs (no LEAF blocks; 0.99-1.03x on vaes256) was not kept.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _aes as A
from ._fused import _c64, _Ptr
from ._grid import Rejections
from .params import PRIME
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_VALUE

V4 = ir.VectorType(A.I64, 4)
ALL = 2**64 - 1
NODES = 4  # nodes per AES batch: 3 registers a node (width 2), in one inline block of 12 (8 at the leaf)
INFLIGHT = 12  # (4 nodes in two blocks of 6, 8 nodes in 8 + 8 + 8: 3-12% slower)


def fits(width: int, has_v: bool, prime: int, tier: str) -> bool:
    """Whether `block_step` covers this flavour: a DCF over F_p (`prime`: the key format version, 1 or
    2) of even width on a 16-register tier."""
    return prime in (1, 2) and has_v and width % 2 == 0 and tier in ("vaes256", "aesni")


def _c4(*words) -> ir.Constant:
    return ir.Constant(V4, [w & ALL for w in (words * (4 // len(words)))])


def _mask(*q) -> ir.Constant:
    return ir.Constant(ir.VectorType(A.I32, len(q)), list(q))


class _Ops(Rejections):
    """F_p steps and block loads and stores on <4 x i64> (two blocks); key format 2's words through
    `element` (`_grid.Rejections`)."""

    def __init__(self, b: ir.IRBuilder):
        self.b = b
        self.p = _c4(PRIME)

    def seed_words(self, kids):
        """Version 2, width 2: [left | right] leaf blocks -> their elements [l0, l1, r0, r1] from the
        seeds' own words (bits 1..61, 62..122; bit 0, t, drops out)."""
        b = self.b
        lo, hi = b.shuffle_vector(kids, kids, _mask(0, 0, 2, 2)), b.shuffle_vector(kids, kids, _mask(1, 1, 3, 3))
        return self.element(b.or_(b.lshr(lo, _c4(1, 62)), b.shl(hi, _c4(63, 2))))

    def half(self, x):
        b = self.b
        return b.add(b.and_(x, self.p), b.lshr(x, _c4(61)))

    def parts(self, ya, yb):
        """Blocks [a0 | a1], [b0 | b1] -> [part(a0), part(b0), part(a1), part(b1)] (`_grid._Prime.part`)."""
        b = self.b
        lo, hi = b.shuffle_vector(ya, yb, _mask(0, 4, 2, 6)), b.shuffle_vector(ya, yb, _mask(1, 5, 3, 7))
        return b.add(self.half(lo), b.add(b.and_(b.shl(hi, _c4(3)), self.p), b.lshr(hi, _c4(58))))

    def share(self, x, flip):
        """x < 2^63 + 2^7 mod p, canonical; where flip is all ones, -x: 8p - x = (x ^ flip) + 8p + 1."""
        b = self.b
        y = self.half(b.add(b.xor(x, flip), b.and_(flip, _c4(8 * PRIME + 1))))
        return b.select(b.icmp_signed(">", y, _c4(PRIME - 1)), b.sub(y, self.p), y)

    def tmask(self, blocks):
        """All ones in both words of each block whose bit 0 (t) is set."""
        b = self.b
        return b.sub(_c4(0), b.and_(b.shuffle_vector(blocks, blocks, _mask(0, 0, 2, 2)), _c4(1)))

    def load2(self, ptr):
        """One 128-bit block in both lanes (a broadcast load)."""
        b = self.b
        v = b.load(b.bitcast(ptr, A.V2.as_pointer()), align=8)
        return b.shuffle_vector(v, v, _mask(0, 1, 0, 1))

    def store(self, ptr, v, lane=None):
        """v, or one 128-bit lane of it, at ptr."""
        b = self.b
        if lane is not None:
            v = b.shuffle_vector(v, v, _mask(2 * lane, 2 * lane + 1))
        b.store(v, b.bitcast(ptr, v.type.as_pointer()), align=8)

    def store_pair(self, ptr, v, width: int):
        """Words 2m, 2m + 1 of two adjacent nodes or leaves (lane 0 the first) from ptr on."""
        if width == 2:
            self.store(ptr, v)
        else:
            self.store(ptr, v, 0)
            self.store(self.b.gep(ptr, [_c64(width)]), v, 1)


@functools.lru_cache(maxsize=None)
def block_step(width: int, tier: str, version: int = 1):
    """The intrinsic with `_grid.grid_step`'s arguments and contract, on node buffers in block layout
    (module docstring): 16 nodes src i .. i + 15 into their 32 children dst j .. j + 31, or with
    `leaf` their shares into `out` (`mask` unused). At level 0 the node is the root: its seed is
    used whole and its t is `party`. `version`: the F_p key format; with 2, VALUE block m and
    width/2 + m are [left acc 2m, 2m + 1 | right acc 2m, 2m + 1] as they come (words & p), a width-2
    leaf reads the seed's words, a wider one LEAF block m, and a rejected word sets flags[0]."""
    words = version == 2
    i64 = types.int64
    half_w = width // 2

    @intrinsic
    def step(typingctx, src, i, dst, j, kcw, level, leaf, out, origin, lo, hi, reverse, party, mask, rk, flags, live):
        sig = types.void(src, i64, dst, i64, kcw, i64, types.boolean, out, i64, i64, i64, types.boolean, i64, types.uint64, rk, flags, i64)

        def codegen(context, b, signature, args):
            aty = signature.args
            S, D, K, O = (_Ptr(context, b, aty[q], args[q]) for q in (0, 2, 4, 7))
            i_, j_, level_, leaf_ = args[1], args[3], args[5], args[6]
            origin_, lo_, hi_, reverse_, party_ = args[8:13]
            aes = A.AesRounds(b, _Ptr(context, b, aty[14], args[14]).data, tier)
            ops, w = _Ops(b), _c64(width)
            flag_ptr = _Ptr(context, b, aty[15], args[15]).at(_c64(0))
            k0 = b.shuffle_vector(aes.keys2[0], aes.keys2[0], _mask(0, 1, 0, 1))
            k_last = b.xor(aes.keys[10], aes.keys[0])

            def mmo(regs):
                """AES_K(x) xor x of whitened blocks (x xor K_0, as `_grid._Mmo`)."""
                parts = regs if aes.per == 2 else [b.shuffle_vector(x, x, _mask(*q)) for x in regs for q in ((0, 1), (2, 3))]
                enc = aes.encrypt(parts, first=False, last=k_last, inflight=INFLIGHT)
                if aes.per == 1:
                    enc = [b.shuffle_vector(enc[q], enc[q + 1], _mask(0, 1, 2, 3)) for q in range(0, len(enc), 2)]
                return [b.xor(e, x) for e, x in zip(enc, regs)]

            def tweak(a, c):
                return b.xor(ir.Constant(V4, [a[0], a[1], c[0], c[1]]), k0)

            def cw(row, col):
                return b.load(K.at(b.add(b.mul(row, _c64(3 + width)), _c64(col))))

            def four(*scalars):
                v = ir.Constant(V4, ir.Undefined)
                for q, s in enumerate(scalars):
                    v = b.insert_element(v, s, ir.Constant(A.I32, q))
                return v

            one, root = _c64(1), b.icmp_signed("==", level_, _c64(0))
            tbit = A.splat(b, b.select(root, _c64(0), one), V4)  # the root's t is party's, not in its seed
            rootm = A.splat(b, b.select(root, b.sub(_c64(0), party_), _c64(0)), V4)
            slo = b.select(root, _c64(ALL), _c64(ALL ^ 1))
            smask = four(slo, _c64(ALL), slo, _c64(ALL))
            cs_lo, cs_hi, ct = cw(level_, 0), cw(level_, 1), cw(level_, 2)
            # children = MMO ^ ((cs, with the t correction in bit 0) & tm): seed and t corrected at once
            csct = four(b.xor(cs_lo, b.and_(ct, one)), cs_hi, b.xor(cs_lo, b.and_(b.lshr(ct, one), one)), cs_hi)
            cv = [four(*(cw(level_, 3 + 2 * m + q) for q in (0, 1, 0, 1))) for m in range(half_w)]
            lv = [four(*(cw(b.add(level_, one), 3 + 2 * m + q) for q in (0, 1, 0, 1))) for m in range(half_w)]
            t_lr = tweak((0, ROLE_LEFT), (0, ROLE_LEFT + 1))
            if words:
                t_v = [tweak((m, ROLE_VALUE), (half_w + m, ROLE_VALUE)) for m in range(half_w)]
                t_leaf = [] if width == 2 else [tweak((m, ROLE_LEAF), (m, ROLE_LEAF)) for m in range(half_w)]
            else:
                t_v = [tweak((2 * m + q, ROLE_VALUE), (width + 2 * m + q, ROLE_VALUE)) for m in range(half_w) for q in (0, 1)]
                t_leaf = [tweak((q, ROLE_LEAF), (q, ROLE_LEAF)) for q in range(width)]
            per_node, per_leaf = 1 + len(t_v), len(t_leaf)

            def payload(y, m):
                """Elements 2m, 2m + 1 of both children, [left | right], from the AES outputs y of their blocks."""
                return ops.element(y[m]) if words else ops.parts(y[2 * m], y[2 * m + 1])
            flip = A.splat(b, b.sub(_c64(0), party_), V4)
            sacc, dacc = b.mul(_c64(3), S.n), b.mul(_c64(3), D.n)

            def leaves(kids_accs):
                """The shares of the nodes' children (child positions j + 2n, + 1) into out, the LEAF
                blocks of all of them in one AES batch; whole stores when every leaf is in range."""
                ys = mmo([b.xor(b.and_(kids, _c4(ALL ^ 1, ALL)), t) for _, kids, _ in kids_accs for t in t_leaf]) if t_leaf else []
                done = []
                for q, (n, kids, accs) in enumerate(kids_accs):
                    y, tm = ys[per_leaf * q : per_leaf * (q + 1)], ops.tmask(kids)
                    conv = [ops.seed_words(kids)] if words and not t_leaf else [payload(y, m) for m in range(half_w)]
                    done.append((n, [ops.share(b.add(b.add(accs[m], conv[m]), b.and_(lv[m], tm)), flip) for m in range(half_w)]))
                ops.flag(flag_ptr)
                first, last = b.add(j_, _c64(2 * done[0][0])), b.add(j_, _c64(2 * done[-1][0] + 1))
                with b.if_else(b.and_(b.icmp_signed(">=", first, lo_), b.icmp_signed("<", last, hi_))) as (whole, edge):
                    with whole:
                        with b.if_else(reverse_) as (rev, fwd):
                            with rev:  # the right leaf first
                                for n, vals in done:
                                    at = b.mul(b.sub(origin_, b.add(j_, _c64(2 * n + 1))), w)
                                    for m in range(half_w):
                                        ops.store_pair(O.at(b.add(at, _c64(2 * m))), b.shuffle_vector(vals[m], vals[m], _mask(2, 3, 0, 1)), width)
                            with fwd:
                                for n, vals in done:
                                    at = b.mul(b.add(origin_, b.add(j_, _c64(2 * n))), w)
                                    for m in range(half_w):
                                        ops.store_pair(O.at(b.add(at, _c64(2 * m))), vals[m], width)
                    with edge:
                        for n, vals in done:
                            for side in (0, 1):
                                pos = b.add(j_, _c64(2 * n + side))
                                at = b.mul(b.select(reverse_, b.sub(origin_, pos), b.add(origin_, pos)), w)
                                with b.if_then(b.and_(b.icmp_signed(">=", pos, lo_), b.icmp_signed("<", pos, hi_))):
                                    for m in range(half_w):
                                        ops.store(O.at(b.add(at, _c64(2 * m))), vals[m], side)

            def batch(first):
                """Nodes first .. first + NODES - 1 of the 16: their blocks in one AES batch, then their children."""
                nodes = range(first, min(first + NODES, 16))
                regs, meta = [], []
                for n in nodes:
                    at = b.mul(b.add(i_, _c64(n)), _c64(2))
                    tm = b.or_(b.sub(_c4(0), b.and_(A.splat(b, b.load(S.at(at)), V4), tbit)), rootm)
                    s = b.and_(ops.load2(S.at(at)), smask)
                    regs += [b.xor(s, t) for t in [t_lr] + t_v]
                    meta.append(tm)
                ys = mmo(regs)
                kids_accs = []
                for q, n in enumerate(nodes):
                    tm, y = meta[q], ys[per_node * q : per_node * (q + 1)]
                    acc = b.add(sacc, b.mul(b.add(i_, _c64(n)), w))
                    accs = [ops.half(b.add(b.add(ops.load2(S.at(b.add(acc, _c64(2 * m)))), payload(y[1:], m)),
                                           b.and_(cv[m], tm))) for m in range(half_w)]
                    kids_accs.append((n, b.xor(y[0], b.and_(csct, tm)), accs))
                ops.flag(flag_ptr)
                with b.if_else(leaf_) as (at_leaf, inner):
                    with at_leaf:
                        leaves(kids_accs)
                    with inner:
                        for n, kids, accs in kids_accs:
                            c = b.add(j_, _c64(2 * n))  # the left child; the right one follows
                            ops.store(D.at(b.mul(c, _c64(2))), kids)
                            for m in range(half_w):
                                ops.store_pair(D.at(b.add(dacc, b.add(b.mul(c, w), _c64(2 * m)))), accs[m], width)

            batch(0)
            for first in range(NODES, 16, NODES):  # past the level's last node (the top levels): skipped
                with b.if_then(b.icmp_signed(">", args[16], _c64(first))):
                    batch(first)
            return context.get_dummy_value()

        return sig, codegen

    return step
