"""numba kernels of the batch codec: the grouped arrays of a `KeyBatch` to the key bodies of the wire
format (`fss.codec`) and back, in one pass and one copy.

Private. `fss.codec` checks shapes, dtypes and lengths; these kernels trust them. A key's body is
written (and read) where it lies in the buffer, with unaligned little-endian 64-bit stores and loads
(`_store64`, `_load64`: the `fss` kernels run on x86-64 and aarch64, both little-endian), while its
group of `GROUP` keys (a few kB) stays in cache. The payload corrections are packed as
`fss.codec._pack` packs them: value after value, each its low `out_bits` bits, least significant bit
first, through a 64-bit accumulator (payloads of 64 and 32 bits: a word, or two values, at a time). Decoding checks what `fss.codec` checks, in the same order per
key, and returns the first failure instead of raising (`OK`, `RESERVED`, `T_PADDING`, `V_PADDING`,
`NOT_REDUCED`).
"""
from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._cache import njit
from .params import GROUP, LAMBDA_BYTES

OK, RESERVED, T_PADDING, V_PADDING, NOT_REDUCED = 0, 1, 2, 3, 4

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U8 = np.uint64(8)
_FF = np.uint64(0xFF)
_M32 = np.uint64(0xFFFF_FFFF)


@intrinsic
def _store64(typingctx, arr, index, value):
    """arr[index:index + 8] = value, little-endian, unaligned (arr: a 1-d C-contiguous uint8 array;
    index unchecked)."""
    def codegen(context, b, signature, args):
        a = context.make_array(signature.args[0])(context, b, args[0])
        ptr = b.bitcast(b.gep(a.data, [args[1]]), ir.IntType(64).as_pointer())
        b.store(args[2], ptr, align=1)
        return context.get_dummy_value()

    return types.void(arr, types.int64, types.uint64), codegen


@intrinsic
def _load64(typingctx, arr, index):
    """arr[index:index + 8] as a little-endian uint64, unaligned (index unchecked)."""
    def codegen(context, b, signature, args):
        a = context.make_array(signature.args[0])(context, b, args[0])
        ptr = b.bitcast(b.gep(a.data, [args[1]]), ir.IntType(64).as_pointer())
        return b.load(ptr, align=1)

    return types.uint64(arr, types.int64), codegen


@njit(nogil=True)
def encode(seeds, cw_seed, cw_t, cw_v, n, out_bits, g0, g1, out, pos0, t_bytes, v_bytes):
    """Writes the bodies of the keys of groups g0 .. g1 - 1 (those below n) one after the other into
    `out` (uint8, 1-d), the first at byte pos0; returns the position after the last. The grouped
    arrays are read through flat views (one index each, stepped by GROUP from lane to level)."""
    bits, count = cw_seed.shape[1], cw_v.shape[1] * cw_v.shape[2]
    S, C, T, V = seeds.reshape(-1), cw_seed.reshape(-1), cw_t.reshape(-1), cw_v.reshape(-1)
    ob = np.uint64(out_bits)
    mask = ~_U0 if out_bits == 64 else (_U1 << ob) - _U1
    pos = np.int64(pos0)
    for g in range(g0, g1):
        for lane in range(min(GROUP, n - g * GROUP)):
            s = g * 2 * GROUP + lane
            _store64(out, pos, S[s])
            _store64(out, pos + 8, S[s + GROUP])
            pos += LAMBDA_BYTES
            c = g * bits * 2 * GROUP + lane
            for _ in range(bits):
                _store64(out, pos, C[c])
                _store64(out, pos + 8, C[c + GROUP])
                pos += LAMBDA_BYTES
                c += 2 * GROUP
            t = g * bits * GROUP + lane
            for j in range(t_bytes):  # four levels a byte, two bits each (left, right)
                byte = 0
                for q in range(min(4, bits - 4 * j)):
                    byte |= (T[t] & 3) << (2 * q)
                    t += GROUP
                out[pos + j] = byte
            pos += t_bytes
            v = g * count * GROUP + lane
            if out_bits == 64:
                for _ in range(count):
                    _store64(out, pos, np.uint64(V[v]))
                    pos += 8
                    v += GROUP
                continue
            end = pos + v_bytes
            if out_bits == 32:  # two values a word, the last one alone
                for _ in range(count // 2):
                    _store64(out, pos, np.uint64(V[v]) | (np.uint64(V[v + GROUP]) << np.uint64(32)))
                    pos += 8
                    v += 2 * GROUP
                if count % 2:
                    x = np.uint64(V[v])
                    for b in range(4):
                        out[pos + b] = (x >> np.uint64(8 * b)) & _FF
                    pos += 4
                continue
            acc, have = _U0, _U0  # `have` low bits of acc are pending
            for _ in range(count):
                x = np.uint64(V[v]) & mask
                v += GROUP
                acc |= x << have
                have += ob
                if have >= 64:
                    _store64(out, pos, acc)
                    pos += 8
                    have -= np.uint64(64)
                    acc = x >> (ob - have) if have > 0 else _U0
            while pos < end:
                out[pos] = acc & _FF
                acc >>= _U8
                pos += 1
    return pos


@njit(nogil=True)
def decode(data, pos0, n, g0, g1, out_bits, prime, seeds, cw_seed, cw_t, cw_v, t_bytes, v_bytes, gap):
    """Reads the bodies of keys (g0 GROUP) .. min(n, g1 GROUP) - 1 from `data` (uint8, 1-d), the first
    at byte pos0 and each `gap` bytes after the one before (0 in a batch; 8, a header, in single keys
    end to end), into the grouped arrays at groups g0 .. g1 - 1, checking each key.
    Returns (`OK`, -1), or (failure, the index of the first key that fails) having stopped there."""
    bits, count = cw_seed.shape[1], cw_v.shape[1] * cw_v.shape[2]
    S, C, T, V = seeds.reshape(-1), cw_seed.reshape(-1), cw_t.reshape(-1), cw_v.reshape(-1)
    ob = np.uint64(out_bits)
    mask = ~_U0 if out_bits == 64 else (_U1 << ob) - _U1
    p = np.uint64((1 << 61) - 1)
    tail_shift = 2 * (bits % 4)  # the last control-bit byte's padding starts there (when bits % 4)
    pos = np.int64(pos0)
    for g in range(g0, g1):
        for lane in range(min(GROUP, n - g * GROUP)):
            k = g * GROUP + lane
            s = g * 2 * GROUP + lane
            S[s] = _load64(data, pos)
            S[s + GROUP] = _load64(data, pos + 8)
            pos += LAMBDA_BYTES
            c = g * bits * 2 * GROUP + lane
            low = _U0
            for _ in range(bits):
                lo = _load64(data, pos)
                low |= lo
                C[c] = lo
                C[c + GROUP] = _load64(data, pos + 8)
                pos += LAMBDA_BYTES
                c += 2 * GROUP
            if low & _U1:
                return RESERVED, k
            t = g * bits * GROUP + lane
            for j in range(t_bytes):
                byte = data[pos + j]
                for q in range(min(4, bits - 4 * j)):
                    T[t] = (byte >> (2 * q)) & 3
                    t += GROUP
            if tail_shift and data[pos + t_bytes - 1] >> tail_shift:
                return T_PADDING, k
            pos += t_bytes
            v = g * count * GROUP + lane
            if out_bits == 64:
                for _ in range(count):
                    V[v] = _load64(data, pos)
                    pos += 8
                    v += GROUP
                pos += gap
                continue
            end = pos + v_bytes
            if out_bits == 32:  # two values a word, the last one alone
                for _ in range(count // 2):
                    w = _load64(data, pos)
                    V[v] = w & _M32
                    V[v + GROUP] = w >> np.uint64(32)
                    pos += 8
                    v += 2 * GROUP
                if count % 2:
                    x = _U0
                    for b in range(4):
                        x |= np.uint64(data[pos + b]) << np.uint64(8 * b)
                    V[v] = x
                    pos += 4
                pos += gap
                continue
            acc, have = _U0, _U0  # `have` low bits of acc are unread
            big = False
            for _ in range(count):
                if have >= ob:
                    x = acc & mask
                    acc >>= ob
                    have -= ob
                else:
                    take = min(8, end - pos)
                    if take == 8:
                        w = _load64(data, pos)
                    else:
                        w = _U0
                        for b in range(take):
                            w |= np.uint64(data[pos + b]) << np.uint64(8 * b)
                    pos += take
                    x = (acc | (w << have)) & mask
                    used = ob - have
                    acc = w >> used if used < 64 else _U0
                    have = np.uint64(8 * take) - used
                big = big | (x >= p)
                V[v] = x
                v += GROUP
            if acc != _U0 or pos != end:
                return V_PADDING, k
            if prime and big:
                return NOT_REDUCED, k
            pos += gap
    return OK, -1


MIN_GROUPS_PER_THREAD = 256  # a group's copy costs about a quarter of a group's eval (`fss.fast`: 64)
_pool_lock = threading.Lock()
_pool: list = []


def spread(run, groups: int) -> None:
    """run(g0, g1) over consecutive ranges that cover the groups, the first in this thread and the
    others on a pool of its own, on up to `fss.backend.set_threads` threads when each gets at least
    MIN_GROUPS_PER_THREAD groups. (Not `fss.fast`'s pool: `fss.keys` imports this module's callers.)"""
    import numba

    parts = max(1, min(numba.get_num_threads(), groups // MIN_GROUPS_PER_THREAD))
    bounds = [groups * c // parts for c in range(parts + 1)]
    futures = []
    if parts > 1:
        with _pool_lock:
            if not _pool:
                from concurrent.futures import ThreadPoolExecutor

                cores = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets its options at import
                _pool.append(ThreadPoolExecutor(max(1, cores - 1), thread_name_prefix="fss-codec"))
        futures = [_pool[0].submit(run, bounds[c], bounds[c + 1]) for c in range(1, parts)]
    try:
        run(bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()


def encode_all(arrays: tuple, n: int, out_bits: int, out: np.ndarray, pos: int, body_len: int, t_bytes: int, v_bytes: int) -> None:
    """Every body of the batch into `out` from byte `pos`, the groups split over the threads."""
    spread(lambda g0, g1: encode(*arrays, n, out_bits, g0, g1, out, pos + g0 * GROUP * body_len, t_bytes, v_bytes),
           arrays[0].shape[0])


def decode_all(data: np.ndarray, pos: int, n: int, out_bits: int, prime: bool, arrays: tuple, body_len: int, t_bytes: int,
               v_bytes: int, gap: int = 0) -> tuple[int, int]:
    """`decode` of every body, the groups split over the threads: the failure of the first bad key."""
    found: list[tuple[int, int]] = []

    def run(g0: int, g1: int) -> None:
        code, k = decode(data, pos + g0 * GROUP * (body_len + gap), n, g0, g1, out_bits, prime, *arrays, t_bytes, v_bytes, gap)
        if code:
            found.append((int(k), int(code)))

    spread(run, arrays[0].shape[0])
    return (min(found)[1], min(found)[0]) if found else (OK, -1)


def new_bytes(size: int) -> tuple[bytes | _Copied, np.ndarray]:
    """A new `bytes` object of `size` bytes and a writable uint8 array over its buffer, to be filled
    before the object is used anywhere (as C code fills `PyBytes_FromStringAndSize(NULL, size)`): the
    encoder writes the batch straight into the bytes it returns, instead of into an array that
    `tobytes` then copies (800 MB for 10^6 DCF(32, 64) keys). Large buffers are advised to use huge
    pages, as numpy advises its own arrays (`_huge_pages`). Outside CPython, an array and a copy."""
    import ctypes
    import sys

    if sys.implementation.name == "cpython" and size > 1:
        try:
            make = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(("PyBytes_FromStringAndSize", ctypes.pythonapi))
            where = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyBytes_AsString", ctypes.pythonapi))
            data = make(None, size)
            address = where(data)
            _huge_pages(address, size)
            return data, np.frombuffer(memoryview((ctypes.c_char * size).from_address(address)), np.uint8)
        except (AttributeError, OSError, TypeError):  # no C API through ctypes: the copy below
            pass
    out = np.empty(size, np.uint8)
    return _Copied(out), out


_HUGE = 1 << 21


def _huge_pages(address: int, size: int) -> None:
    """madvise(MADV_HUGEPAGE) over the whole 2 MiB pages of a buffer of 4 MiB or more, as numpy does
    for its arrays (Linux only, best effort): one page fault per 2 MiB instead of per 4 kiB, which on a
    virtual machine is most of the cost of writing fresh memory (0.2 against 0.5-0.7 s for 800 MB)."""
    import sys

    if size < 2 * _HUGE or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        madvise = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(("madvise", ctypes.CDLL(None)))
        lo, hi = -(-address // _HUGE) * _HUGE, (address + size) // _HUGE * _HUGE
        madvise(lo, hi - lo, 14)  # MADV_HUGEPAGE; an error (no THP) changes nothing
    except (AttributeError, OSError, TypeError):
        pass


class _Copied:
    """The fallback of `new_bytes`: the array's bytes, copied once it is filled (`bytes(obj)`)."""

    def __init__(self, out: np.ndarray):
        self.out = out

    def __bytes__(self) -> bytes:
        return self.out.tobytes()
