"""Secure comparison, sign and ReLU on masked inputs between two simulated parties (`fss.gates`).

A dealer (offline, before the inputs exist) draws the masks and makes the keys; online the input's
owner publishes only x_hat = x + r_in mod 2^32, each party evaluates its key at x_hat alone, and the
two output shares add up to g(x) + r_out. Here the dealer also plays the output's receiver and removes
r_out at the end; in a protocol r_out would be the next gate's input mask.

    python examples/masked_comparison.py
"""
import numpy as np

from fss import ComparisonGate, ReluGate
from fss.gates import sign_gate

BITS = 32
N = 1 << BITS
values = np.array([-70000, -1, 0, 1, 41, 42, 43, 2**31 - 1, -2**31], dtype=np.int64)  # private, two's complement
threshold = 42

gates = {
    f"x < {threshold}": ComparisonGate(BITS, threshold, signed=True),  # [x < c], c public
    "x >= 0": sign_gate(BITS),  # [x >= 0] (DReLU)
    "ReLU(x)": ReluGate(BITS),  # max(x, 0), in Z_2^32
}

# --- offline: the dealer ------------------------------------------------------------------------
dealt = {}
for name, gate in gates.items():
    r_in, r_out = gate.random_masks(len(values))  # from the OS CSPRNG
    key0, key1 = gate.gen_batch(r_in, r_out)  # key0 to party 0, key1 to party 1
    dealt[name] = (r_in, r_out, key0, key1)

# --- online: the owner of x publishes x_hat; each party evaluates alone ---------------------------
print(f"{'x':>12} | " + " | ".join(f"{name:>14}" for name in gates))
results = {}
for name, gate in gates.items():
    r_in, r_out, key0, key1 = dealt[name]
    x_hat = (values.astype(np.uint64) + r_in) & np.uint64(N - 1)  # all the parties see of x
    y0 = gate.eval_batch(key0, x_hat)  # party 0
    y1 = gate.eval_batch(key1, x_hat)  # party 1
    masked = gate.reconstruct(y0, y1)  # g(x) + r_out: still hidden by r_out
    results[name] = gate.reconstruct(masked, (-r_out.astype(object)) % gate.modulus, signed=True)  # the receiver unmasks

for i, x in enumerate(values):
    print(f"{int(x):>12} | " + " | ".join(f"{int(results[name][i]):>14}" for name in gates))
    assert results[f"x < {threshold}"][i] == int(x < threshold)
    assert results["x >= 0"][i] == int(x >= 0)
    assert results["ReLU(x)"][i] == max(int(x), 0)

# ReLU from the sign gate would need one multiplication of shared values (a Beaver triple);
# ReluGate's key carries r_in in a second DCF payload instead: the same two DCF evaluations.
print(f"a party's key: a DCF key of {gates['x >= 0'].dcf.key_size} bytes and a share of r_out (comparison, sign), "
      f"or of {gates['ReLU(x)'].dcf.key_size} bytes and shares of r_out and r_in (ReLU); all values agree with the cleartext")
