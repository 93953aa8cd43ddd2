"""dpcdf: differentially private empirical CDFs, centrally or over two servers with FSS keys.

    import dpcdf
    grid = dpcdf.Grid.uniform(0, 100, bits=10)
    rel = dpcdf.release_ecdf(values, grid, epsilon=1.0)      # "auto": the most accurate mechanism
    rel.ecdf([10, 50]); rel.quantile([0.5, 0.9]); rel.statement

Three parts, dependencies one way (`fss` <- release <- service <- CLI/demo; apps use release and the
service's analyst): `dpcdf.release` (the central DP release), `dpcdf.service` (two servers, clients,
the analyst), `dpcdf.apps` (ROC/AUC, Hosmer-Lemeshow, plots). `dpcdf.Analyst`, the CLI and the demo
sit on top of all three.
"""
from .apps.hosmer_lemeshow import HosmerLemeshow, hosmer_lemeshow
from .apps.hosmer_lemeshow_direct import NoisyHosmerLemeshow, hosmer_lemeshow_direct
from .apps.roc import RocRelease, roc
from .errors import DomainError, DpcdfError, ParameterError
from .release import metrics
from .release.ecdf import Release, prefix_counts, quantiles, release_ecdf
from .release.grid import Grid
from .release.adaptive import AdaptiveMechanism
from .release.mechanisms import PathMechanism, TreeMechanism
from .release.factorization import SqrtFactorizationMechanism, sqrt_factorization
from .release.zcdp import GaussianTreeMechanism, gaussian_tree

__all__ = ["AdaptiveMechanism", "DomainError", "DpcdfError", "GaussianTreeMechanism", "Grid", "HosmerLemeshow", "NoisyHosmerLemeshow", "ParameterError", "PathMechanism", "Release",
           "RocRelease", "SqrtFactorizationMechanism", "TreeMechanism", "gaussian_tree", "hosmer_lemeshow", "hosmer_lemeshow_direct", "metrics", "prefix_counts", "quantiles", "release_ecdf", "roc", "sqrt_factorization"]


def __getattr__(name: str):
    """`dpcdf.Analyst` and `dpcdf.reconcile` load the service (HTTP, HPKE) only when asked for."""
    if name == "Analyst":
        from .analyst import Analyst

        return Analyst
    if name == "reconcile":
        from .service import reconcile

        return reconcile
    raise AttributeError(f"module 'dpcdf' has no attribute {name!r}")
