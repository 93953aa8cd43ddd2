"""Slow, obviously written reference of every `fss` algorithm: the oracle of the tests and the
source of the test vectors. Python ints only; one AES block at a time; no numpy, no numba.

The tree (BCG+21 Fig. 1 for the DCF; BGI16 for the DPF, which is the same walk without the
per-level payload) works on internal inputs x' = x xor c in [0, 2^bits) and computes

    f'(x') = beta_below * [x' < alpha'] + beta_equal * [x' == alpha']   (mod 2^out_bits, per element)

`TreeParams.input_xor` gives c and which of beta_below, beta_equal are beta or zero.

The payload group is Z_{2^out_bits} or, with `TreeParams.prime`, F_p (p = 2^61 - 1): the walk is the
same, arithmetic is mod `TreeParams.modulus`. An F_p element of key format version 1 is a whole PRG
block mod p (VALUE block d*width + e for child d's element e; at the leaf (s >> 1) mod p for width 1,
else LEAF block e); of version 2, a word's low 61 bits, rejection-sampled (`prg.element`), at the
ring's positions, and at a leaf of width 1 or 2 the seed's own words (`prg.seed_word`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .params import HEADER_LEN, TreeParams
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_RIGHT, ROLE_SEED, ROLE_VALUE, element, expand_one, seed_word, source

_LO = (1 << 64) - 1


@dataclass
class RefKey:
    party: int
    seed: int  # 128-bit root seed
    cw_seed: list[int]  # per level, 128 bits with bit 0 zero
    cw_t: list[tuple[int, int]]  # per level (t_L, t_R)
    cw_v: list[list[int]]  # per payload level (bits + 1 for a DCF, 1 for a DPF), width elements


def function_value(p: TreeParams, alpha: int, beta: list[int], x: int) -> list[int]:
    """The shared function itself, straight from its definition (the truth the shares must add to)."""
    holds = {"lt": x < alpha, "le": x <= alpha, "gt": x > alpha, "ge": x >= alpha, "eq": x == alpha}[p.cmp]
    return [b % p.modulus for b in beta] if holds else [0] * p.width


def _expand(p: TreeParams, s: int, side: int) -> tuple[int, int, list[int]]:
    """Child `side` (0 left, 1 right) of seed s: (seed with bit 0 cleared, control bit, payload)."""
    b0 = expand_one(s, ROLE_RIGHT if side else ROLE_LEFT, 0)
    v = []
    if p.level_payload and p.block_elements:
        v = [expand_one(s, ROLE_VALUE, side * p.width + e) % p.modulus for e in range(p.width)]
    elif p.level_payload:
        for e in range(p.width):
            word = side * p.width + e  # both children's words, packed densely into VALUE blocks
            block = expand_one(s, ROLE_VALUE, word // 2)
            w = (block >> (64 * (word % 2))) & _LO
            v.append(element(w, s, source(ROLE_VALUE, word)) if p.prime else w & p.mask)
    return b0 & ~1, b0 & 1, v


def convert(p: TreeParams, s: int) -> list[int]:
    """Leaf seed -> payload vector: the seed's high word for width 1, else LEAF-role blocks (F_p: the
    seed without its control bit, or whole LEAF blocks, mod p)."""
    if p.block_elements:
        if p.width == 1:
            return [(s >> 1) % p.modulus]
        return [expand_one(s, ROLE_LEAF, e) % p.modulus for e in range(p.width)]
    if p.prime and p.seed_leaf:
        return [element(seed_word(s, e), s, source(ROLE_SEED, e)) for e in range(p.width)]
    if p.prime:
        return [element((expand_one(s, ROLE_LEAF, e // 2) >> (64 * (e % 2))) & _LO, s, source(ROLE_LEAF, e)) for e in range(p.width)]
    if p.width == 1:
        return [(s >> 64) & p.mask]
    out = []
    for e in range(p.width):
        block = expand_one(s, ROLE_LEAF, e // 2)
        out.append((block >> (64 * (e % 2))) & _LO & p.mask)
    return out


def _neg_if(cond: int, v: list[int], modulus: int) -> list[int]:
    return [(-x) % modulus for x in v] if cond else list(v)


def gen(p: TreeParams, alpha: int, beta: list[int], seed0: int, seed1: int) -> tuple[RefKey, RefKey]:
    """Both parties' keys for public-domain alpha and payload beta, from the two root seeds."""
    m, n, w = p.modulus, p.bits, p.width
    a = (alpha & p.domain_mask) ^ p.input_xor
    beta = [b % m for b in beta]
    below = beta if p.beta_below else [0] * w
    equal = beta if p.beta_equal else [0] * w
    s, t = [seed0, seed1], [0, 1]
    v_alpha = [0] * w
    cw_seed, cw_t, cw_v = [], [], []
    for i in range(n):
        a_i = (a >> (n - 1 - i)) & 1
        keep, lose = a_i, 1 - a_i
        kids = [[_expand(p, s[b], side) for side in (0, 1)] for b in (0, 1)]  # kids[b][side]
        s_cw = kids[0][lose][0] ^ kids[1][lose][0]
        t_cw = (kids[0][0][1] ^ kids[1][0][1] ^ a_i ^ 1, kids[0][1][1] ^ kids[1][1][1] ^ a_i)
        if p.level_payload:
            v0l, v1l = kids[0][lose][2], kids[1][lose][2]
            vcw = [(v1l[e] - v0l[e] - v_alpha[e] + (below[e] if lose == 0 else 0)) % m for e in range(w)]
            vcw = _neg_if(t[1], vcw, m)
            v0k, v1k = kids[0][keep][2], kids[1][keep][2]
            signed_cw = _neg_if(t[1], vcw, m)
            v_alpha = [(v_alpha[e] - v1k[e] + v0k[e] + signed_cw[e]) % m for e in range(w)]
            cw_v.append(vcw)
        cw_seed.append(s_cw)
        cw_t.append(t_cw)
        for b in (0, 1):
            sk, tk, _ = kids[b][keep]
            s[b], t[b] = (sk ^ s_cw, tk ^ t_cw[keep]) if t[b] else (sk, tk)
    c0, c1 = convert(p, s[0]), convert(p, s[1])
    last = [(c1[e] - c0[e] - v_alpha[e] + equal[e]) % m for e in range(w)]
    cw_v.append(_neg_if(t[1], last, m))
    return (RefKey(0, seed0, cw_seed, cw_t, cw_v), RefKey(1, seed1, list(cw_seed), list(cw_t), list(cw_v)))


def eval(p: TreeParams, key: RefKey, x: int) -> list[int]:  # noqa: A001 - the algorithm's name
    """Party key.party's share of f(x), x in the public domain."""
    m, n, w = p.modulus, p.bits, p.width
    xi = (x & p.domain_mask) ^ p.input_xor
    s, t = key.seed, key.party
    acc = [0] * w
    for i in range(n):
        d = (xi >> (n - 1 - i)) & 1
        s_next, t_next, v = _expand(p, s, d)
        if t:
            s_next ^= key.cw_seed[i]
            t_next ^= key.cw_t[i][d]
        if p.level_payload:
            add = [(v[e] + (key.cw_v[i][e] if t else 0)) % m for e in range(w)]
            acc = [(acc[e] + a) % m for e, a in enumerate(_neg_if(key.party, add, m))]
        s, t = s_next, t_next
    leaf = [(c + (key.cw_v[-1][e] if t else 0)) % m for e, c in enumerate(convert(p, s))]
    return [(acc[e] + a) % m for e, a in enumerate(_neg_if(key.party, leaf, m))]


def encode(p: TreeParams, key: RefKey) -> bytes:
    """The single-key wire format, written field by field (see `fss.codec` for the layout)."""
    out = bytearray(p.header(key.party))
    out += key.seed.to_bytes(16, "little")
    for cw in key.cw_seed:
        out += cw.to_bytes(16, "little")
    tbits = 0
    for i, (tl, tr) in enumerate(key.cw_t):
        tbits |= (tl << (2 * i)) | (tr << (2 * i + 1))
    out += tbits.to_bytes(p.t_bytes, "little")
    vbits, pos = 0, 0
    for level in key.cw_v:
        for val in level:
            vbits |= val << pos
            pos += p.out_bits
    out += vbits.to_bytes(p.v_bytes, "little")
    return bytes(out)


def decode(p: TreeParams, data: bytes) -> RefKey:
    """Inverse of `encode` (trusting; the strict decoder is `fss.codec`)."""
    party = data[2]
    pos = HEADER_LEN
    seed = int.from_bytes(data[pos : pos + 16], "little")
    pos += 16
    cw_seed = []
    for _ in range(p.bits):
        cw_seed.append(int.from_bytes(data[pos : pos + 16], "little"))
        pos += 16
    tbits = int.from_bytes(data[pos : pos + p.t_bytes], "little")
    pos += p.t_bytes
    cw_t = [((tbits >> (2 * i)) & 1, (tbits >> (2 * i + 1)) & 1) for i in range(p.bits)]
    vbits = int.from_bytes(data[pos : pos + p.v_bytes], "little")
    vals = [(vbits >> (k * p.out_bits)) & p.mask for k in range(p.v_levels * p.width)]
    cw_v = [vals[i * p.width : (i + 1) * p.width] for i in range(p.v_levels)]
    return RefKey(party, seed, cw_seed, cw_t, cw_v)
