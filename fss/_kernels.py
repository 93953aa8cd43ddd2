"""numba kernels of the portable backend: the per-level bookkeeping around one AES ECB call.

Private. The callers in `fss.portable` validate shapes and dtypes; these trust their inputs, never
raise, and do all arithmetic in uint64 (wrapping mod 2^64; masks to 2^out_bits are applied by the
caller, which is exact because 2^out_bits divides 2^64).

Layouts (n keys, struct of arrays): seeds (2, n) = lo and hi words; payloads (width, n); PRG blocks
(n, blocks, 2) in the order the ECB call sees them. Eval reads correction words from a KeyBatch's
grouped arrays (one level of them: key k at [k // GROUP, ..., k % GROUP]).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._cache import njit
from .keys import GROUP
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_VALUE

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_NOT1 = ~np.uint64(1)
_LEFT = np.uint64(ROLE_LEFT)
_VALUE = np.uint64(ROLE_VALUE)
_LEAF = np.uint64(ROLE_LEAF)


@njit(nogil=True)
def fill_eval(s, d, width, buf):
    """PRG inputs of one level of single-point eval: child d[k]'s seed block, then (if buf has more
    than one block) the value blocks holding child d[k]'s payload words d*width .. d*width+width-1."""
    n, nb = buf.shape[0], buf.shape[1]
    for k in range(n):
        lo, hi = s[0, k], s[1, k]
        buf[k, 0, 0] = lo
        buf[k, 0, 1] = hi ^ (_LEFT + d[k])
        first = (np.uint64(d[k]) * np.uint64(width)) >> _U1
        for q in range(1, nb):
            buf[k, q, 0] = lo ^ (first + np.uint64(q - 1))
            buf[k, q, 1] = hi ^ _VALUE


@njit(nogil=True)
def fill_expand(s, buf):
    """PRG inputs that expand both children of each seed: LEFT and RIGHT seed blocks, then the
    VALUE blocks 0 .. buf.shape[1] - 3 (gen and full-domain eval)."""
    n, nb = buf.shape[0], buf.shape[1]
    for k in range(n):
        lo, hi = s[0, k], s[1, k]
        for side in range(2):
            buf[k, side, 0] = lo
            buf[k, side, 1] = hi ^ (_LEFT + np.uint64(side))
        for j in range(2, nb):
            buf[k, j, 0] = lo ^ np.uint64(j - 2)
            buf[k, j, 1] = hi ^ _VALUE


@njit(nogil=True)
def fill_leaf(s, buf):
    """PRG inputs of the LEAF blocks that convert a leaf seed into a payload of width > 1."""
    n, nb = buf.shape[0], buf.shape[1]
    for k in range(n):
        for j in range(nb):
            buf[k, j, 0] = s[0, k] ^ np.uint64(j)
            buf[k, j, 1] = s[1, k] ^ _LEAF


@njit(nogil=True)
def eval_level(out, s, t, acc, cw_seed, cw_t, cw_v, d, has_v):
    """One level for n keys, each walking to child d[k]; out[k] holds that child's blocks as filled
    by `fill_eval`; cw_seed (G, 2, GROUP), cw_t (G, GROUP), cw_v (G, width, GROUP) are this level's grouped
    corrections. Updates seeds s, control bits t and (DCF) the payload sums acc in place; the
    party's sign is applied once at the end by the caller."""
    w, n = acc.shape[0], acc.shape[1]
    for k in range(n):
        g, lane = k // GROUP, k % GROUP
        tk = t[k]
        tm = _U0 - np.uint64(tk)
        lo = out[k, 0, 0]
        tn = np.uint8(lo & _U1)
        s[0, k] = (lo & _NOT1) ^ (cw_seed[g, 0, lane] & tm)
        s[1, k] = out[k, 0, 1] ^ (cw_seed[g, 1, lane] & tm)
        t[k] = tn ^ ((cw_t[g, lane] >> d[k]) & tk)
        if has_v:
            base = np.int64(d[k]) * w
            first = base >> 1
            for e in range(w):
                word = base + e
                acc[e, k] += out[k, 1 + (word >> 1) - first, word & 1] + (np.uint64(cw_v[g, e, lane]) & tm)


@njit(nogil=True)
def finish_eval(acc, conv, t, cw_last, negate):
    """acc := (-1)^party * (acc + Convert(s) + t * CW_{n+1}) for every key; cw_last (G, width, GROUP)."""
    w, n = acc.shape[0], acc.shape[1]
    for k in range(n):
        tm = _U0 - np.uint64(t[k])
        for e in range(w):
            v = acc[e, k] + conv[e, k] + (np.uint64(cw_last[k // GROUP, e, k % GROUP]) & tm)
            acc[e, k] = _U0 - v if negate else v


@njit(nogil=True)
def _pick(mask, one, zero):
    """`one` where `mask` is all ones, `zero` where it is 0: a select by masks, no branch."""
    return (one & mask) | (zero & ~mask)


@njit(nogil=True)
def gen_level(out, s, t, v_alpha, a_bits, below, cw_seed, cw_t, cw_v, has_v):
    """One level of Gen for n key pairs (BCG+21 Fig. 1, step 4). out[b, k] holds the blocks of party
    b's seed for key k as filled by `fill_expand`. Writes this level's correction words and advances
    both parties' seeds (s[b] = (lo, hi) rows) and control bits along alpha's path, in place.

    Branch-free in the secrets: alpha's bit (`a_bits`), the control bits `t` and every PRG word.
    Alpha's bit becomes a mask `keep` (all ones: keep the right child and correct the left one), and
    each child's word is read from both children at indices fixed by k, e and the layout alone, then
    chosen with `_pick`; the control bit t1 negates by (x ^ m) - m. The only branches and indices are
    on public values (k, e, n, width, has_v). tests/fss_tests/test_constant_time.py checks this source
    (ast: no condition or index on a secret-derived name) and the compiled LLVM IR (no conditional
    branch, switch or address computed from a_bits or t); it does not check the machine code LLVM
    emits from it (a select may still become a branch there), nor the AES calls around the kernel."""
    w, n = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        keep = _U0 - (np.uint64(a_bits[k]) & _U1)  # all ones iff alpha's bit here is 1
        bit = np.uint8(keep & _U1)
        lo_l0, lo_l1, lo_r0, lo_r1 = out[0, k, 0, 0], out[1, k, 0, 0], out[0, k, 1, 0], out[1, k, 1, 0]
        hi_l0, hi_l1, hi_r0, hi_r1 = out[0, k, 0, 1], out[1, k, 0, 1], out[0, k, 1, 1], out[1, k, 1, 1]
        s_lo = _pick(keep, lo_l0 ^ lo_l1, lo_r0 ^ lo_r1) & _NOT1  # the lost child's seeds, xored
        s_hi = _pick(keep, hi_l0 ^ hi_l1, hi_r0 ^ hi_r1)
        t_l = np.uint8((lo_l0 ^ lo_l1) & _U1) ^ bit ^ np.uint8(1)
        t_r = np.uint8((lo_r0 ^ lo_r1) & _U1) ^ bit
        cw_seed[0, k] = s_lo
        cw_seed[1, k] = s_hi
        cw_t[k] = t_l | (t_r << np.uint8(1))
        t_keep = np.uint8(_pick(keep, np.uint64(t_r), np.uint64(t_l)))
        neg = _U0 - (np.uint64(t[1, k]) & _U1)  # all ones iff party 1's control bit is 1
        if has_v:
            for e in range(w):
                r = w + e  # the right child's element e (the left's is e): block 2 + i // 2, word i % 2
                l0, l1 = out[0, k, 2 + (e >> 1), e & 1], out[1, k, 2 + (e >> 1), e & 1]
                r0, r1 = out[0, k, 2 + (r >> 1), r & 1], out[1, k, 2 + (r >> 1), r & 1]
                raw = _pick(keep, l1 - l0, r1 - r0) - v_alpha[e, k] + (below[e, k] & keep)  # beta left of alpha
                cw_v[e, k] = (raw ^ neg) - neg  # -raw where t1, else raw
                v_alpha[e, k] += _pick(keep, r0 - r1, l0 - l1) + raw
        for b in range(2):
            lo = _pick(keep, out[b, k, 1, 0], out[b, k, 0, 0])
            hi = _pick(keep, out[b, k, 1, 1], out[b, k, 0, 1])
            tm = _U0 - np.uint64(t[b, k])
            s[b, 0, k] = (lo & _NOT1) ^ (s_lo & tm)
            s[b, 1, k] = hi ^ (s_hi & tm)
            t[b, k] = np.uint8(lo & _U1) ^ (t_keep & t[b, k])


@njit(nogil=True)
def gen_leaf(conv0, conv1, t1, v_alpha, equal, cw_last):
    """Final correction word (BCG+21 Fig. 1, step 5, with beta added on x == alpha when `equal`),
    negated where party 1's control bit t1 is 1 by (c ^ m) - m: no branch on t1."""
    w, n = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        neg = _U0 - (np.uint64(t1[k]) & _U1)
        for e in range(w):
            c = conv1[e, k] - conv0[e, k] - v_alpha[e, k] + equal[e, k]
            cw_last[e, k] = (c ^ neg) - neg


@njit(nogil=True)
def full_level(out, s, t, cw_lo, cw_hi, cw_t, s_next, t_next):
    """Expand every node of one level of a single DPF key's tree into both children."""
    n = s.shape[1]
    for k in range(n):
        tm = _U0 - np.uint64(t[k])
        for side in range(2):
            lo = out[k, side, 0]
            s_next[0, 2 * k + side] = (lo & _NOT1) ^ (cw_lo & tm)
            s_next[1, 2 * k + side] = out[k, side, 1] ^ (cw_hi & tm)
            t_next[2 * k + side] = np.uint8(lo & _U1) ^ ((cw_t >> np.uint8(side)) & t[k])


@njit(nogil=True)
def sum_columns(values, mask):
    """Sum over axis 1 of a (width, n) uint64 array, mod 2^64, then masked."""
    w = values.shape[0]
    total = np.zeros(w, dtype=np.uint64)
    for e in range(w):
        acc = _U0
        for k in range(values.shape[1]):
            acc += values[e, k]
        total[e] = acc & mask
    return total


@njit(nogil=True)
def fill_eval_at(s, xs, shift, width, buf):
    """`fill_eval` with child d[k] = bit `shift` of xs[k] (no separate array of bits)."""
    n, nb = buf.shape[0], buf.shape[1]
    sh = np.uint64(shift)
    for k in range(n):
        d = (xs[k] >> sh) & _U1
        lo, hi = s[0, k], s[1, k]
        buf[k, 0, 0] = lo
        buf[k, 0, 1] = hi ^ (_LEFT + d)
        first = (d * np.uint64(width)) >> _U1
        for q in range(1, nb):
            buf[k, q, 0] = lo ^ (first + np.uint64(q - 1))
            buf[k, q, 1] = hi ^ _VALUE


@intrinsic
def _prefetch(typingctx, arr, index):
    """A read prefetch (llvm.prefetch, into every cache level) of the cache line of arr[index], a
    1-d C-contiguous array; index unchecked (a prefetch never faults)."""
    def codegen(context, b, signature, args):
        a = context.make_array(signature.args[0])(context, b, args[0])
        ptr = b.bitcast(b.gep(a.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        try:
            fn = b.module.get_global("llvm.prefetch.p0")
        except KeyError:
            fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), name="llvm.prefetch.p0")
        b.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, types.uint64), codegen


PREFETCH_GROUPS = 16  # the level kernels fetch the corrections of the group this far ahead


@njit(nogil=True)
def eval_step_at(enc, inp, s, t, acc, cw_seed, cw_t, cw_v, g0, level, v_level, xs, shift, width, has_v, last):
    """One level of `eval_batch` (`eval_level`) for keys GROUP g0 + k of a batch's whole grouped
    arrays (cw_seed (G, bits, 2, GROUP), cw_t (G, bits, GROUP), cw_v (G, v_levels, width, GROUP),
    C-contiguous) at `level` (payload row `v_level`), d[k] = bit `shift` of xs[k], on the ECB output
    itself (the MMO output is enc ^ inp: no separate xor pass), fused with the next level's
    `fill_eval_at`: each key's child seed, control bit and payload sum, then, unless `last`, its PRG
    inputs of the next level (bit `shift - 1`) written over inp[k] (read first). The seeds go to s
    only at the last level (for Convert); between levels they live in inp. width: the payload width.
    Flat unsigned indices into the C-contiguous arrays (no negative-index checks in the loop), and
    this level's corrections of the group PREFETCH_GROUPS ahead prefetched: a level's corrections
    of consecutive groups lie bits * 256 bytes apart, a stride the CPU's prefetchers miss, so
    without it the loop waited on memory for most of its time (4096 keys at bits = 32: about 150 us
    a level against 30 us from the cache; not from a table). Every line of each range, its last
    word's included: numpy's arrays start 16 bytes past a cache line here, so a group's 128 bytes
    of payload corrections span three lines."""
    n, nb = inp.shape[0], inp.shape[1]
    E, I = enc.reshape(-1), inp.reshape(-1)
    CS, CT, CV = cw_seed.reshape(-1), cw_t.reshape(-1), cw_v.reshape(-1)
    bits, vl = np.uint64(cw_seed.shape[1]), np.uint64(cw_v.shape[1])
    G = np.uint64(GROUP)
    w = np.uint64(width)
    sh = np.uint64(shift)
    nsh = np.uint64(shift - 1) if shift > 0 else np.uint64(0)
    one_wide = width == 1 and has_v
    stride = np.uint64(2 * nb)
    for k0 in range(0, n, GROUP):
        g = np.uint64(g0 + k0 // GROUP)
        cs = ((g * bits + np.uint64(level)) * np.uint64(2)) * G
        ct = (g * bits + np.uint64(level)) * G
        cv = (g * vl + np.uint64(v_level)) * w * G
        if k0 + PREFETCH_GROUPS * GROUP < n:  # this level's corrections of a group ahead: the groups lie
            ahead = np.uint64(PREFETCH_GROUPS)  # 8 KiB apart, a stride the CPU's prefetchers miss
            a = cs + ahead * bits * np.uint64(2) * G
            for q in range(np.uint64(0), np.uint64(2 * GROUP), np.uint64(8)):  # lo and hi: 4 lines
                _prefetch(CS, a + q)
            _prefetch(CS, a + np.uint64(2 * GROUP - 1))  # and a fifth: the arrays start 16 bytes past a line
            _prefetch(CT, ct + ahead * bits * G)
            a = cv + ahead * vl * w * G
            for q in range(np.uint64(0), w * G, np.uint64(8)):
                _prefetch(CV, a + q)
            _prefetch(CV, a + w * G - _U1)
        for lane in range(np.uint64(min(GROUP, n - k0))):
            k = np.uint64(k0) + lane
            b = k * stride
            x = xs[k]
            d = (x >> sh) & _U1
            tk = np.uint64(t[k])
            tm = _U0 - tk
            lo = E[b] ^ I[b]
            slo = (lo & _NOT1) ^ (CS[cs + lane] & tm)
            shi = E[b + _U1] ^ I[b + _U1] ^ (CS[cs + G + lane] & tm)
            t[k] = np.uint8((lo & _U1) ^ ((np.uint64(CT[ct + lane]) >> d) & tk))
            if one_wide:  # width 1: child d's payload is word d of the one value block
                acc[0, k] += (E[b + np.uint64(2) + d] ^ I[b + np.uint64(2) + d]) + (np.uint64(CV[cv + lane]) & tm)
            elif has_v:
                base = d * w
                first = base >> _U1
                for e in range(w):
                    word = base + e
                    at = b + np.uint64(2) + np.uint64(2) * ((word >> _U1) - first) + (word & _U1)
                    acc[e, k] += (E[at] ^ I[at]) + (np.uint64(CV[cv + e * G + lane]) & tm)
            if last:
                s[0, k] = slo
                s[1, k] = shi
            else:
                dn = (x >> nsh) & _U1
                I[b] = slo
                I[b + _U1] = shi ^ (_LEFT + dn)
                fn = (dn * w) >> _U1
                for q in range(np.uint64(1), np.uint64(nb)):
                    I[b + np.uint64(2) * q] = slo ^ (fn + q - _U1)
                    I[b + np.uint64(2) * q + _U1] = shi ^ _VALUE


@njit(nogil=True)
def eval_step_w1(enc, inp, s, t, acc, cw_seed, cw_t, cw_v, g0, level, xs, shift, last):
    """`eval_step_at` for the common DCF of width 1 (two blocks a key: the seed block, then the
    value block whose word d is child d's payload), on whole groups: n (inp.shape[0]) a multiple
    of GROUP (the caller pads xs, t, acc and the buffers; the padding lanes compute garbage nobody
    reads). Fewer live values than the general loop, so the compiler keeps them in registers."""
    n = inp.shape[0]
    E, I = enc.reshape(-1), inp.reshape(-1)
    CS, CT, CV = cw_seed.reshape(-1), cw_t.reshape(-1), cw_v.reshape(-1)
    A = acc.reshape(-1)
    bits, vl = np.uint64(cw_seed.shape[1]), np.uint64(cw_v.shape[1])
    G = np.uint64(GROUP)
    sh = np.uint64(shift)
    nsh = np.uint64(shift - 1) if shift > 0 else np.uint64(0)
    lev = np.uint64(level)
    for k0 in range(np.uint64(0), np.uint64(n), G):
        g = np.uint64(g0) + k0 // G
        cs = (g * bits + lev) * np.uint64(2) * G
        ct = (g * bits + lev) * G
        cv = (g * vl + lev) * G
        if k0 + np.uint64(PREFETCH_GROUPS) * G < np.uint64(n):  # the corrections of a group ahead (see eval_step_at)
            ahead = np.uint64(PREFETCH_GROUPS)
            a = cs + ahead * bits * np.uint64(2) * G
            for q in range(np.uint64(0), np.uint64(2 * GROUP), np.uint64(8)):
                _prefetch(CS, a + q)
            _prefetch(CS, a + np.uint64(2 * GROUP - 1))  # the last line too (see eval_step_at)
            _prefetch(CT, ct + ahead * bits * G)
            a = cv + ahead * vl * G
            _prefetch(CV, a)
            _prefetch(CV, a + np.uint64(8))
            _prefetch(CV, a + G - _U1)
        for lane in range(G):
            k = k0 + lane
            b = k * np.uint64(4)
            x = xs[k]
            d = (x >> sh) & _U1
            tk = np.uint64(t[k])
            tm = _U0 - tk
            lo = E[b] ^ I[b]
            slo = (lo & _NOT1) ^ (CS[cs + lane] & tm)
            shi = E[b + _U1] ^ I[b + _U1] ^ (CS[cs + G + lane] & tm)
            t[k] = np.uint8((lo & _U1) ^ ((np.uint64(CT[ct + lane]) >> d) & tk))
            A[k] += (E[b + np.uint64(2) + d] ^ I[b + np.uint64(2) + d]) + (np.uint64(CV[cv + lane]) & tm)
            if last:
                s[0, k] = slo
                s[1, k] = shi
            else:
                dn = (x >> nsh) & _U1
                I[b] = slo
                I[b + _U1] = shi ^ (_LEFT + dn)
                I[b + np.uint64(2)] = slo  # value block 0 (child dn's word dn)
                I[b + np.uint64(3)] = shi ^ _VALUE
