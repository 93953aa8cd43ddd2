"""dpcdf: differentially private empirical CDFs, centrally or over two servers with FSS keys.

    import dpcdf
    grid = dpcdf.Grid.uniform(0, 100, bits=10)
    rel = dpcdf.release_ecdf(values, grid, epsilon=1.0)      # "auto": the most accurate mechanism
    rel.ecdf([10, 50]); rel.quantile([0.5, 0.9]); rel.statement
"""
from . import metrics
from .errors import DomainError, DpcdfError, ParameterError
from .grid import Grid
from .mechanisms import PathMechanism, TreeMechanism
from .hosmer_lemeshow import HosmerLemeshow, hosmer_lemeshow
from .hosmer_lemeshow_direct import NoisyHosmerLemeshow, hosmer_lemeshow_direct
from .release import Release, prefix_counts, quantiles, release_ecdf
from .roc import RocRelease, roc

__all__ = ["DomainError", "DpcdfError", "Grid", "HosmerLemeshow", "NoisyHosmerLemeshow", "ParameterError", "PathMechanism", "Release",
           "RocRelease", "TreeMechanism", "hosmer_lemeshow", "hosmer_lemeshow_direct", "metrics", "prefix_counts", "quantiles", "release_ecdf", "roc"]
