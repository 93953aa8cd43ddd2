"""Writes gates_v1.json: known answers for the gates on masked inputs (`fss.gates`): for fixed masks and
fixed randomness, both parties' keys (the DCF key's bytes and the mask shares) and their output shares
at a few masked inputs.

The randomness is SHA-256 of a label (as in `generate.py`), fed to the gates' deterministic path
(`_gen_with_randomness`: the DCF's two root seeds, then 16 bytes per mask share); each DCF key is
checked against `fss.reference` made from the same root seeds, and each output against the cleartext
gate, before anything is written. A rerun reproduces the file byte for byte; regenerate only on a
deliberate change of the gates' key layout or outputs (bump the version in the label and file name).
`tests/fss_tests/test_gates.py` fails whenever a key byte, share or output drifts.

    python tests/vectors/generate_gates.py
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fss import ComparisonGate, IntervalGate, MultiIntervalGate, ReluGate
from fss import reference as R

OUT = Path(__file__).with_name("gates_v1.json")

SPECS = [  # the gate, its r_in values (the domain's edges and a middle value)
    ({"gate": "ComparisonGate", "bits": 32, "c": 1000}, [0, 999, (1 << 32) - 1]),
    ({"gate": "ComparisonGate", "bits": 8, "c": -3, "signed": True, "out_bits": 16}, [0, 200]),
    ({"gate": "ComparisonGate", "bits": 64, "c": 1 << 63, "group": "p61"}, [(1 << 64) - 1, 12345678901234567890]),
    ({"gate": "IntervalGate", "bits": 16, "p": 100, "q": 200}, [0, 65500]),
    ({"gate": "IntervalGate", "bits": 64, "p": -5, "q": (1 << 62), "signed": True}, [(1 << 64) - 1, 3]),
    ({"gate": "IntervalGate", "bits": 5, "p": 0, "q": 31, "out_bits": 1}, [17]),
    ({"gate": "MultiIntervalGate", "bits": 8, "intervals": [[0, 9], [10, 99], [100, 255]], "group": "p61"}, [0, 250]),
    ({"gate": "ReluGate", "bits": 16}, [0, 40000]),
    ({"gate": "ReluGate", "bits": 12, "out_bits": 32}, [4095]),
    ({"gate": "ReluGate", "bits": 32, "group": "p61"}, [7, (1 << 32) - 1]),
    ({"gate": "ReluGate", "bits": 64}, [(1 << 63) + 1]),
]


def make_gate(spec: dict):
    """The gate a vector's spec names (also used by the test that replays the vectors)."""
    kw = {"out_bits": spec.get("out_bits"), "group": spec.get("group", "ring")}
    name, bits = spec["gate"], spec["bits"]
    if name == "ReluGate":
        return ReluGate(bits, **kw)
    kw["signed"] = spec.get("signed", False)
    if name == "ComparisonGate":
        return ComparisonGate(bits, spec["c"], **kw)
    if name == "IntervalGate":
        return IntervalGate(bits, spec["p"], spec["q"], **kw)
    return MultiIntervalGate(bits, [tuple(pq) for pq in spec["intervals"]], **kw)


def cleartext(gate, x: int) -> list[int]:
    """g(x) for x in the gate's domain (signed or not), one value per output, before the output mask."""
    if isinstance(gate, ReluGate):
        return [max(x, 0) % gate.modulus]
    return [int(lo <= x + gate._offset < hi) for lo, hi in gate._bounds]


def _bytes(label: str, n: int) -> bytes:
    blocks = (hashlib.sha256(f"fss-dpcdf gate vector v1 {label} {i}".encode()).digest() for i in range(-(-n // 32)))
    return b"".join(blocks)[:n]


def _points(gate, r_in: int) -> list[int]:
    """x values: the domain's edges, around zero and the gate's bounds, and the x with x_hat = 0."""
    n = gate.bits
    lo, hi = (-(1 << (n - 1)), (1 << (n - 1)) - 1) if isinstance(gate, ReluGate) or gate.signed else (0, (1 << n) - 1)
    near = [0, 1, -1] + [v - gate._offset + d for b in getattr(gate, "_bounds", []) for v in b for d in (-1, 0)]
    wrap = (-r_in) % (1 << n)  # x_hat = 0
    wrap = wrap - (1 << n) if wrap > hi else wrap
    return sorted({v for v in [lo, hi, wrap, *near] if lo <= v <= hi})


def vector(spec: dict, r_in: int) -> dict:
    gate = make_gate(spec)
    label = f"{gate!r} r_in={r_in}"
    m = len(cleartext(gate, 0))
    r_out = [int.from_bytes(_bytes(f"{label} r_out {j}", 16), "little") % gate.modulus for j in range(m)]
    rnd = _bytes(label, gate._random_bytes(1))
    k0, k1 = gate._gen_with_randomness(r_in, r_out[0] if m == 1 else r_out, rnd)
    beta = [1, r_in % gate.modulus] if isinstance(gate, ReluGate) else [1]
    ref = R.gen(gate.params, r_in, beta, int.from_bytes(rnd[:16], "little"), int.from_bytes(rnd[16:32], "little"))
    assert [R.encode(gate.params, k).hex() for k in ref] == [k0.dcf_key.to_bytes().hex(), k1.dcf_key.to_bytes().hex()]
    out = {"describe": repr(gate), **spec, "r_in": r_in, "r_out": r_out, "randomness": rnd.hex(),
           "dcf_key0": k0.dcf_key.to_bytes().hex(), "dcf_key1": k1.dcf_key.to_bytes().hex(),
           "mask_shares0": list(k0.shares), "mask_shares1": list(k1.shares), "points": []}
    for x in _points(gate, r_in):
        x_hat = (x + r_in) % (1 << gate.bits)
        y0, y1 = gate.eval(k0, x_hat), gate.eval(k1, x_hat)
        y0, y1 = ([y0], [y1]) if m == 1 else (list(y0), list(y1))
        value = cleartext(gate, x)
        assert [(a + b) % gate.modulus for a, b in zip(y0, y1)] == [(v + o) % gate.modulus for v, o in zip(value, r_out)]
        out["points"].append({"x": x, "x_hat": x_hat, "shares0": y0, "shares1": y1, "value": value})
    return out


def main() -> None:
    vectors = [vector(spec, r_in) for spec, r_ins in SPECS for r_in in r_ins]
    doc = {"about": "fss-dpcdf gates on masked inputs (fss.gates), key layout v1: DCF key bytes (format of fss_v1.json / "
                    "fss_prime_v2.json) and the parties' mask shares; generated by tests/vectors/generate_gates.py",
           "vectors": vectors}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
