"""The central DP release: the grid, the tree geometry, exact discrete Laplace noise, the mechanisms
with their privacy statements, post-processing, `release_ecdf`, and the error metrics.

It knows nothing of keys, HTTP or servers: the same mechanism code runs on plain counts here (the
trusted-curator mode) and on the two servers' noisy shares in `dpcdf.service`.
May import: `dpcdf.errors` and third-party libraries; never `dpcdf.service`, `dpcdf.apps`, `fss`.
"""
from .ecdf import Release, finish_release, prefix_counts, quantiles, release_ecdf
from .grid import Grid
from .mechanisms import PathMechanism, TreeMechanism

__all__ = ["Grid", "PathMechanism", "Release", "TreeMechanism", "finish_release", "prefix_counts", "quantiles", "release_ecdf"]
