"""Writes tests/vectors/factorization_v1.json: what the square-root factorization mechanism releases
and how it is calibrated, so a change to R, its exact sensitivities, sigma^2 or the estimate is seen.

    python tests/vectors/generate_factorization.py
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dpcdf.release.factorization import column_sensitivities, right_factor, sqrt_factorization

SIZES = [2, 5, 64, 1024]
RHO = 0.5


def release_of(size: int, relation: str) -> list[float]:
    """The estimate from a fixed release y_i = (7 i) mod 101 - 50 (and n = 1000 under substitution)."""
    mech = sqrt_factorization(size, RHO, relation)
    y = ((7 * np.arange(size)) % 101 - 50).astype(np.float64)
    if relation == "substitution":
        y = np.append(y, 1000.0)
    raw, fitted = mech.estimate(y)
    return [round(float(v), 6) for v in fitted]


def main() -> None:
    cases = []
    for size in SIZES:
        r = right_factor(size)
        single, pair = column_sensitivities(size)
        case = {"size": size, "r_head": [int(v) for v in r[:16]], "r_sha256": hashlib.sha256(r.astype("<i8").tobytes()).hexdigest(),
                "single": single, "pair": pair}
        for relation in ("substitution", "add-remove"):
            s2 = sqrt_factorization(size, RHO, relation).sigma2
            case[relation] = {"sigma2": f"{s2.numerator}/{s2.denominator}"}
            if size <= 64:
                case[relation]["estimate"] = release_of(size, relation)
        cases.append(case)
    out = Path(__file__).with_name("factorization_v1.json")
    out.write_text(json.dumps({"rho": RHO, "cases": cases}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
