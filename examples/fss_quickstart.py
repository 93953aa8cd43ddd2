"""fss in a minute: share the comparison t -> [value <= t] of many private values between two
servers, count at a few thresholds from the key shares alone, and check against the plain count.

    python examples/fss_quickstart.py
"""
import numpy as np

from fss import DCF

values = np.array([3, 17, 17, 42, 100, 250, 999, 1000, 4096, 65535], dtype=np.uint64)
dcf = DCF(bits=16, out_bits=32, cmp="ge")  # f_v(t) = 1 if t >= v: the shares count values <= t

k0, k1 = dcf.gen_batch(values, 1)  # one key pair per value; k0 goes to server 0, k1 to server 1
thresholds = np.array([0, 16, 17, 100, 1000, 65535])
share0 = dcf.eval_sum(k0, thresholds)  # what server 0 computes, seeing only random-looking keys
share1 = dcf.eval_sum(k1, thresholds)
counts = dcf.reconstruct(share0, share1)

print(f"{dcf!r}: {dcf.key_size} bytes per key, {len(values)} values")
print(f"{'threshold':>9} {'share 0':>12} {'share 1':>12} {'count':>6} {'plain':>6}")
for t, s0, s1, c in zip(thresholds, share0, share1, counts):
    plain = int((values <= t).sum())
    assert c == plain
    print(f"{t:>9} {s0:>12} {s1:>12} {c:>6} {plain:>6}")
