"""The HPKE suites a task can seal its shares with (RFC 9180 base mode, HKDF-SHA256, AES-128-GCM):

- "x25519": DHKEM(X25519, HKDF-SHA256), the default;
- "mlkem768-x25519": the hybrid ML-KEM-768 + X25519 KEM, for shares that must stay sealed against a
  future quantum adversary (harvest now, decrypt later).

pyca/cryptography implements both (OpenSSL). A server keeps one key pair per KEM in its data
directory (0600), made at first start; its public keys are served at GET /hpke.
"""
from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from ..errors import ParameterError
from .files import write_secret

KEMS = {"x25519": hpke.KEM.X25519, "mlkem768-x25519": hpke.KEM.MLKEM768_X25519}
_X_LEN = 32


def suite(kem: str) -> hpke.Suite:
    return hpke.Suite(KEMS[check_kem(kem)], hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)


def check_kem(kem: str) -> str:
    if kem not in KEMS:
        raise ParameterError(f"kem must be one of {tuple(KEMS)}, got {kem!r}")
    return kem


def enc_length(kem: str) -> int:
    return KEMS[check_kem(kem)].enc_length()


def public_key(kem: str, hex_key: str):
    """A recipient public key from its hex form (the hybrid's is ML-KEM's 1184 bytes, then X25519's 32)."""
    raw = bytes.fromhex(hex_key)
    try:
        if check_kem(kem) == "x25519":
            return x25519.X25519PublicKey.from_public_bytes(raw)
        return hpke.MLKEM768X25519PublicKey(mlkem.MLKEM768PublicKey.from_public_bytes(raw[:-_X_LEN]),
                                            x25519.X25519PublicKey.from_public_bytes(raw[-_X_LEN:]))
    except ValueError as exc:
        raise ParameterError(f"not a {kem} public key: {exc}") from None


class ServerKeys:
    """A server's private keys for every KEM, loaded from (or made in) its data directory."""

    def __init__(self, data_dir: Path):
        xpath, mpath = data_dir / "hpke_x25519.pem", data_dir / "hpke_mlkem768.seed"
        if not xpath.exists():
            key = x25519.X25519PrivateKey.generate()
            write_secret(xpath, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        if not mpath.exists():
            write_secret(mpath, mlkem.MLKEM768PrivateKey.generate().private_bytes_raw())
        loaded = serialization.load_pem_private_key(xpath.read_bytes(), password=None)
        if not isinstance(loaded, x25519.X25519PrivateKey):  # (its bytes would be published as an X25519 key)
            raise ParameterError(f"{xpath} holds a {type(loaded).__name__}, not an X25519 private key")
        self.x25519 = loaded
        self.mlkem = mlkem.MLKEM768PrivateKey.from_seed_bytes(mpath.read_bytes())

    def private(self, kem: str):
        if check_kem(kem) == "x25519":
            return self.x25519
        return hpke.MLKEM768X25519PrivateKey(self.mlkem, self.x25519)

    def public_hex(self, kem: str) -> str:
        x = self.x25519.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        if check_kem(kem) == "x25519":
            return x.hex()
        return (self.mlkem.public_key().public_bytes_raw() + x).hex()
