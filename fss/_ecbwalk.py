"""The portable eval of a whole batch in one numba call: the level loop of `portable.eval_batch`
with pycryptodome's C `ECB_encrypt` called from the kernel through its address (`prg.ecb_pointers`).

Why: the Python loop around each level's ECB call and numba step cost about as much as their work
(two dispatches a level). The AES is the same C routine on the same buffers, so the outputs are
those of the Python loop, bit for bit. A DCF of width 1 takes `level_w1`, a group at a time (fewer
live pointers than `_kernels.eval_step_w1`, which spilled them in its loop). Private.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _kernels as K
from ._cache import njit
from .keys import GROUP

_U1 = np.uint64(1)
_G = np.uint64(GROUP)


@intrinsic
def _ecb(typingctx, fn, state, inp, out):
    """ECB_encrypt(state, inp, out, bytes of inp) at address fn (uint64s); inp and out C-contiguous
    uint64 arrays of the same size. Returns the C status (0: done)."""
    def codegen(context, b, signature, args):
        i8p = ir.IntType(8).as_pointer()
        fty = ir.FunctionType(ir.IntType(32), [i8p, i8p, i8p, ir.IntType(64)])
        a_in = context.make_array(signature.args[2])(context, b, args[2])
        a_out = context.make_array(signature.args[3])(context, b, args[3])
        nbytes = b.mul(a_in.nitems, ir.Constant(ir.IntType(64), 8))
        return b.call(b.inttoptr(args[0], fty.as_pointer()),
                      [b.inttoptr(args[1], i8p), b.bitcast(a_in.data, i8p), b.bitcast(a_out.data, i8p), nbytes])

    return types.int32(types.uint64, types.uint64, inp, out), codegen


@njit(nogil=True)
def _group_w1(E, I, s, t, A, CS, CT, CV, cs, ct, cv, xs, k0, shift, last):
    """One level of the GROUP keys from k0 of a width-1 DCF (`_kernels.eval_step_w1`'s arithmetic on
    flat arrays; t uint64; child d's payload word by a select, not an indexed load)."""
    sh = np.uint64(shift)
    nsh = np.uint64(shift - 1) if shift > 0 else np.uint64(0)
    for lane in range(_G):
        k = k0 + lane
        b = k * np.uint64(4)
        x = xs[k]
        d = (x >> sh) & _U1
        tk = t[k]
        tm = np.uint64(0) - tk
        lo = E[b] ^ I[b]
        hi = E[b + _U1] ^ I[b + _U1]
        v0 = E[b + np.uint64(2)] ^ I[b + np.uint64(2)]
        v1 = E[b + np.uint64(3)] ^ I[b + np.uint64(3)]
        slo = (lo & ~_U1) ^ (CS[cs + lane] & tm)
        shi = hi ^ (CS[cs + _G + lane] & tm)
        t[k] = (lo & _U1) ^ ((np.uint64(CT[ct + lane]) >> d) & tk)
        A[k] += (v1 if d else v0) + (np.uint64(CV[cv + lane]) & tm)
        if last:
            s[0, k] = slo
            s[1, k] = shi
        else:  # the next level's seed block (LEFT + dn) and value block 0
            dn = (x >> nsh) & _U1
            I[b] = slo
            I[b + _U1] = shi ^ (_U1 + dn)
            I[b + np.uint64(2)] = slo
            I[b + np.uint64(3)] = shi ^ np.uint64(3)


@njit(nogil=True)
def level_w1(E, I, s, t, A, CS, CT, CV, g0, groups, level, bits, vl, xs, last):
    """`_group_w1` over `groups` groups from group g0 at `level`, prefetching this level's corrections
    PREFETCH_GROUPS groups ahead (see `_kernels.eval_step_at`), up to the last word of each range: a
    group's 128 bytes of corrections at 16 bytes past a line span three lines, not two."""
    ahead = K.PREFETCH_GROUPS
    for j in range(groups):
        g, lev = np.uint64(g0 + j), np.uint64(level)
        cs = (g * np.uint64(bits) + lev) * np.uint64(2 * GROUP)
        ct = (g * np.uint64(bits) + lev) * _G
        cv = (g * np.uint64(vl) + lev) * _G
        if j + ahead < groups:  # each range's last word too: numpy's arrays need not start on a cache line
            a = cs + np.uint64(ahead * bits * 2 * GROUP)
            for q in range(np.uint64(0), np.uint64(2 * GROUP), np.uint64(8)):
                K._prefetch(CS, a + q)
            K._prefetch(CS, a + np.uint64(2 * GROUP - 1))
            K._prefetch(CT, ct + np.uint64(ahead * bits * GROUP))
            a = cv + np.uint64(ahead * vl * GROUP)
            K._prefetch(CV, a)
            K._prefetch(CV, a + np.uint64(8))
            K._prefetch(CV, a + _G - _U1)
        _group_w1(E, I, s, t, A, CS, CT, CV, cs, ct, cv, xs, np.uint64(j * GROUP), bits - 1 - level, last)


@njit(nogil=True)
def eval_chunks(fn, state, seeds, party, xs, cw_seed, cw_t, cw_v, width, nb, vb, has_v, chunk, acc):
    """`portable.eval_batch` (non-prime keys) for all n keys: acc (width, n) gets the shares before
    the mask. seeds (G, 2, GROUP) and the grouped corrections as in a KeyBatch; nb: PRG blocks a
    key and level; vb: LEAF blocks of Convert (0 for width 1: the seed's high word); chunk: groups
    walked together. Returns the first nonzero ECB status (0: all done)."""
    n, G = xs.shape[0], seeds.shape[0]
    bits, vl = cw_seed.shape[1], cw_v.shape[1]
    mp = chunk * GROUP
    s = np.empty((2, mp), np.uint64)
    t = np.empty(mp, np.uint8)
    t64 = np.empty(mp, np.uint64)
    part = np.empty((width, mp), np.uint64)
    x = np.empty(mp, np.uint64)
    inp = np.empty((mp, nb, 2), np.uint64)
    out = np.empty_like(inp)
    conv = np.empty((width, mp), np.uint64)
    lin = np.empty((mp, max(vb, 1), 2), np.uint64)
    lout = np.empty_like(lin)
    CS, CT, CV = cw_seed.reshape(-1), cw_t.reshape(-1), cw_v.reshape(-1)
    w1 = width == 1 and has_v
    for g0 in range(0, G, chunk):
        g1 = min(G, g0 + chunk)
        k0, k1 = g0 * GROUP, min(n, g1 * GROUP)
        m, ml = k1 - k0, (g1 - g0) * GROUP
        for j in range(g1 - g0):
            for lane in range(GROUP):
                s[0, j * GROUP + lane] = seeds[g0 + j, 0, lane]
                s[1, j * GROUP + lane] = seeds[g0 + j, 1, lane]
        t[:] = party
        t64[:] = party
        part[:] = 0
        x[:] = 0
        for k in range(m):  # element loops, not slice copies: a copy compiles numba's shape-error formatting (~8 s)
            x[k] = xs[k0 + k]
        I, E = inp[:ml], out[:ml]
        K.fill_eval_at(s, x, bits - 1, width, I)
        for i in range(bits):
            st = _ecb(fn, state, I, E)
            if st != 0:
                return st
            if w1:
                level_w1(E.reshape(-1), I.reshape(-1), s, t64, part.reshape(-1), CS, CT, CV, g0, g1 - g0, i, bits, vl, x,
                         i == bits - 1)
            else:
                K.eval_step_at(E, I, s, t, part, cw_seed, cw_t, cw_v, g0, i, i if has_v else 0, x, bits - 1 - i, width, has_v,
                               i == bits - 1)
        if w1:
            for k in range(ml):
                t[k] = t64[k]
        if vb == 0:
            for k in range(ml):
                conv[0, k] = s[1, k]
        else:  # LEAF blocks: words 0 .. width - 1 of MMO(seed xor LEAF tweaks)
            K.fill_leaf(s[:, :ml], lin[:ml])
            st = _ecb(fn, state, lin[:ml], lout[:ml])
            if st != 0:
                return st
            for k in range(ml):
                for e in range(width):
                    conv[e, k] = lout[k, e >> 1, e & 1] ^ lin[k, e >> 1, e & 1]
        K.finish_eval(part[:, :ml], conv[:, :ml], t[:ml], cw_v[g0:g1, vl - 1], party == 1)
        for e in range(width):
            for k in range(m):
                acc[e, k0 + k] = part[e, k]
    return 0
