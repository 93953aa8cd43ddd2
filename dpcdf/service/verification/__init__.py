"""The report check's arithmetic (docs/verification.md): pure functions over the prime field F_p of
`fss.field` on numpy arrays, no HTTP, no storage, no keys. A layer below the protocols and the
client: `TaskConfig` and the client need it (a verified task's key width, the client's check
randomness) as much as the servers' protocol steps (`protocols.check`: round one, the exchange, the
outcome) do.
- `randomness`: the challenges both servers derive and the client's correlated randomness;
- `maths`: `Check`, the check's two rounds and its verdicts per payload kind (`dpcdf.release.payload`),
  over the numba kernels of `sketch`;
- `reference`: the textbook construction, one step per function, the tests' oracle.
May import: `fss`, `dpcdf.release`, `dpcdf.errors`; nothing else of the service."""
