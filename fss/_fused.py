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
        self.b.store(value, self.b.bitcast(self.at(offset), A.V8.as_pointer()), align=1)


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
