"""Prints the serialized key size of common DCF and DPF parameters next to the paper's formula.

    python bench/key_sizes.py
"""
from fss import DCF, DPF

ROWS = [
    DCF(16, 32), DCF(16, 64), DCF(32, 32), DCF(32, 64), DCF(64, 64),
    DCF(16, 32, 2), DCF(32, 64, 2), DCF(32, 64, 3), DCF(64, 64, 3),
    DPF(16, 64), DPF(20, 32), DPF(32, 64), DPF(64, 64),
]


def main() -> None:
    print(f"{'function':<48} {'key bytes':>9} {'formula':>9} {'overhead':>8} {'batch bytes/key':>15}")
    for fn in ROWS:
        formula = fn.params.formula_bits / 8
        print(f"{fn!r:<48} {fn.key_size:>9} {formula:>9.1f} {fn.key_size - formula:>8.1f} {fn.params.body_len:>15}")


if __name__ == "__main__":
    main()
