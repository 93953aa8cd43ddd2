"""The PRG of every tree function: fixed-key AES-128 in Matyas-Meyer-Oseas mode with tweaks.

What it is
    H(x) = AES_K(x) xor x (Matyas-Meyer-Oseas) under one fixed, public key K. A seed s is expanded
    into output block j of role r as

        G_{r,j}(s) = H(s xor T(r, j)),   T(r, j) = the 128-bit block with words (lo = j, hi = r)

    Roles: LEFT (1) and RIGHT (2) give a node's children's seeds, VALUE (3) the payload words of both
    children, LEAF (4) converts a leaf seed into a payload vector when it does not fit into the seed's
    high word. Distinct tweaks give
    independent-looking blocks in the ideal-permutation model; a tweak instead of a key per block
    keeps one AES key schedule, so one ECB call (or one set of AES round keys in a kernel) covers
    every block of a level.

Block layout
    A block is 16 bytes, read as two little-endian 64-bit words (lo, hi). The block G_{LEFT+d,0}(s)
    is child d's seed and control bit: t = bit 0 of lo, seed = the block with bit 0 cleared (127 bits
    of entropy). The payload words of both children are packed densely into the blocks
    G_{VALUE,j}(s), j = 0..width-1, two words a block (lo, then hi): child d's element e is word
    d*width + e. So a single-point eval reads 1 + ceil(width/2) blocks a level (2 for width 1), and
    expanding both children (gen, multi-point eval) 2 + width (3 for width 1).

Prime-field payloads
    Over F_p (p = 2^61 - 1, `fss.field`) a key of format version 1 takes each payload element from a
    whole block, read as a 128-bit integer mod p (within 2^-122 of uniform), in the layout above with
    one element where a word would be. Version 2 (the default) packs them as the ring does, a word
    an element, and reads element x = word & (2^61 - 1), which is exactly uniform on [0, p) but for
    the one value 2^61 - 1 = p: that x (probability 2^-61) is rejected and the element resampled
    (`resample`) from RESAMPLE (5) blocks of the seed that was expanded, so that every element is
    exactly uniform, as Prio3 samples field elements by rejection; never a biased "mod p". At a leaf,
    a width-1 or width-2 payload is read from the seed itself (bits 1..61, then 62..122: element e is
    word e of the seed shifted right by one bit, `seed_word`), wider ones from LEAF blocks. So a
    width-2 DCF key's grid walk costs 4 blocks a node (LEFT, RIGHT, 2 VALUE) and none at the leaves
    instead of 6 and 2: 8,186 -> 4,092 blocks for round one's check at 2^10 points.

Where K comes from
    K = SHA-256(LABEL)[:16] with LABEL = b"fss-dpcdf/prg/aes128-mmo/v1". Changing the label (a new
    version) changes every key byte and output, and the test vectors catch it.

What it is not
    Not a PRF with a secret key: security rests on the seeds being secret and on AES behaving like
    a random permutation under a public key (the usual fixed-key assumption; Guo et al., S&P 2020).
    With many seeds in play the multi-instance bound is about q * N / 2^127 for q adversary queries
    and N expanded seeds, which is ample at our scales.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import warnings

import numpy as np
from Crypto.Cipher import AES

LABEL = b"fss-dpcdf/prg/aes128-mmo/v1"
FIXED_KEY = hashlib.sha256(LABEL).digest()[:16]

ROLE_LEFT = 1
ROLE_RIGHT = 2
ROLE_VALUE = 3
ROLE_LEAF = 4
ROLE_RESAMPLE = 5
ROLE_SEED = 0  # in a rejected element's source: the word came from the leaf seed itself
M61 = (1 << 61) - 1  # the prime p, and the mask of an element's 61 bits

_ECB = AES.new(FIXED_KEY, AES.MODE_ECB)


def mmo_blocks(inp: np.ndarray, out: np.ndarray) -> None:
    """out = AES_K(inp) xor inp over a whole buffer of blocks (uint64 arrays, last axis of 2 words,
    C-contiguous), in one pycryptodome ECB call. This is the portable backend's AES."""
    _ECB.encrypt(inp.view(np.uint8).reshape(-1).data, output=out.view(np.uint8).reshape(-1).data)
    np.bitwise_xor(out, inp, out=out)


def encrypt_blocks(inp: np.ndarray, out: np.ndarray) -> None:
    """out = AES_K(inp) (no MMO xor: for callers that xor the input back in themselves)."""
    _ECB.encrypt(inp.view(np.uint8).reshape(-1).data, output=out.view(np.uint8).reshape(-1).data)


def tweak(role: int, j: int) -> int:
    """The tweak T(role, j) as a 128-bit int (lo word = j, hi word = role)."""
    return j | (role << 64)


def expand_one(seed: int, role: int, j: int) -> int:
    """Reference single block: G_{role,j}(seed) as a 128-bit int (little-endian block)."""
    x = (seed ^ tweak(role, j)).to_bytes(16, "little")
    return int.from_bytes(_ECB.encrypt(x), "little") ^ int.from_bytes(x, "little")


def source(role: int, j: int) -> int:
    """Which word a rejected F_p element came from: word j of role `role`'s blocks (VALUE: child d's
    element e is word d*width + e; LEAF: word e; ROLE_SEED: word e of the leaf seed, `seed_word`)."""
    return (role << 20) | j


def seed_word(seed: int, e: int) -> int:
    """Word e (0 or 1) of a leaf seed without its control bit: bits 1 + 61 e .. 64 + 61 e of the block."""
    return (seed >> (1 + 61 * e)) & 0xFFFF_FFFF_FFFF_FFFF


def resample(seed: int, src: int) -> int:
    """The F_p element that replaces a rejected one (a word whose low 61 bits are all ones) of the
    expansion of `seed` at `source` src: the low 61 bits of the first block G_{RESAMPLE, 2^32 a + src}(seed),
    a = 0, 1, ..., that are not all ones. Exactly uniform on [0, p) in the ideal-permutation model."""
    a = 0
    while True:
        x = expand_one(seed, ROLE_RESAMPLE, (a << 32) | src) & M61
        if x != M61:
            return x
        a += 1


def element(word: int, seed: int, src: int) -> int:
    """The F_p element of a 64-bit PRG word (key format version 2): its low 61 bits, resampled if they are p."""
    x = word & M61
    return x if x != M61 else resample(seed, src)


# The fast path into pycryptodome's C ECB routine. pycryptodome's public `encrypt` checks its buffers
# and builds their C pointers on every call (about 20 us); the portable eval calls it once a level, so
# it reaches past the public API into private internals that a release may rename or change:
# `Crypto.Cipher._mode_ecb.raw_ecb_lib.ECB_encrypt` (and its C signature, which `fss._ecbwalk` calls
# through its address), the cipher's `_state`, and `Crypto.Util._raw_api` (`backend`, `ffi`,
# `c_uint8_ptr`, `c_size_t`). `_raw_ecb()` probes them once, checks the routine against the public
# API on one block, and on any failure logs one warning (logger "fss", and a RuntimeWarning) naming
# what failed; the portable eval then takes the public API (same bits, slower). `fast_ecb()` says
# which path is active, `fast_ecb_error()` why not (also in `fss.backend.info()`).
ECB_SIGNATURE = "int(*)(void *, uint8_t *, uint8_t *, size_t)"  # ECB_encrypt(state, in, out, bytes) as `_ecbwalk` calls it
SLOW_PATH = ("fss's portable backend falls back to pycryptodome's public ECB API: the same outputs, but its eval_batch "
             "runs a Python loop a level with a slower ECB call, about 1.5x slower on large batches and 3-5x on "
             "small ones (the fused AES-NI/VAES tiers are not affected)")
_log = logging.getLogger("fss")
_probe_lock = threading.Lock()
_raw: tuple | None = None  # (lib, state, c_uint8_ptr, c_size_t, routine address, state address) once probed
_raw_error: str | None = None
_probed = False


def _probe_raw():
    from Crypto.Cipher import _mode_ecb
    from Crypto.Util import _raw_api

    if _raw_api.backend != "cffi":
        raise RuntimeError(f"pycryptodome uses its {_raw_api.backend!r} backend, not cffi (install cffi)")
    ffi, lib = _raw_api.ffi, _mode_ecb.raw_ecb_lib
    sig = ffi.getctype(ffi.typeof(lib.ECB_encrypt))
    if sig != ECB_SIGNATURE:
        raise RuntimeError(f"ECB_encrypt is now {sig!r}, not {ECB_SIGNATURE!r}")
    state = _ECB._state.get()
    c_uint8_ptr, c_size_t = _raw_api.c_uint8_ptr, _raw_api.c_size_t
    block = bytes(range(16))
    out = bytearray(16)
    status = lib.ECB_encrypt(state, c_uint8_ptr(block), c_uint8_ptr(out), c_size_t(16))
    if status or bytes(out) != _ECB.encrypt(block):
        raise RuntimeError(f"ECB_encrypt on one block returned status {status} and did not match the public encrypt")
    return lib, state, c_uint8_ptr, c_size_t, int(ffi.cast("uintptr_t", lib.ECB_encrypt)), int(ffi.cast("uintptr_t", state))


def _raw_ecb() -> tuple | None:
    """The probed internals (see above), or None after the one warning of the process."""
    global _raw, _raw_error, _probed
    if not _probed:
        with _probe_lock:
            if not _probed:
                try:
                    _raw = _probe_raw()
                except Exception as exc:  # another pycryptodome, or its ctypes backend
                    _raw_error = f"{type(exc).__name__}: {exc}"
                    msg = f"fss: cannot use pycryptodome's private ECB internals ({_raw_error}); {SLOW_PATH}"
                    _log.warning(msg)
                    warnings.warn(msg, RuntimeWarning, stacklevel=3)
                _probed = True
    return _raw


def fast_ecb() -> bool:
    """True when the portable backend calls pycryptodome's C ECB routine directly (probes it the first time)."""
    return _raw_ecb() is not None


def fast_ecb_error() -> str | None:
    """Why the fast ECB path is not active (what failed), or None when it is."""
    _raw_ecb()
    return _raw_error


def ecb_pointers() -> tuple[int, int] | None:
    """(address of pycryptodome's C `ECB_encrypt`, address of the fixed key's ECB state), for kernels
    that call the ECB routine themselves (`fss._ecbwalk`); None (after one warning a process) when
    pycryptodome's internals are not as expected. The state lives as long as this module (`_ECB`)."""
    raw = _raw_ecb()
    return None if raw is None else (raw[4], raw[5])


class EcbPass:
    """out = AES_K(inp) (no MMO xor) over the same two buffers again and again (the portable eval's
    levels): pycryptodome's ECB, with the C pointers of the buffers made once. `encrypt` costs about
    20 us of Python per call around the C call (buffer checks and pointers), as much as the AES of
    a 4096-key level; when the fast path is active (`fast_ecb`) this calls its C `ECB_encrypt` on
    the kept pointers, else the public `encrypt`. The buffers must stay alive and unmoved."""

    def __init__(self, inp: np.ndarray, out: np.ndarray):
        self._in = inp.view(np.uint8).reshape(-1).data
        self._out = out.view(np.uint8).reshape(-1).data
        self._call = None
        raw = _raw_ecb()
        if raw is not None and len(self._in) == len(self._out):
            lib, state, c_uint8_ptr, c_size_t = raw[:4]
            pin, pout = c_uint8_ptr(self._in), c_uint8_ptr(self._out)
            size = c_size_t(len(self._in))
            self._call = lambda: lib.ECB_encrypt(state, pin, pout, size)  # noqa: E731

    def __call__(self) -> None:
        if self._call is None:
            _ECB.encrypt(self._in, output=self._out)
        elif self._call():
            raise ValueError("pycryptodome's ECB_encrypt failed")
