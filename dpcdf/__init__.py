"""dpcdf: differentially private empirical CDFs, centrally or over two servers with FSS keys.

    import dpcdf
    grid = dpcdf.Grid.uniform(0, 100, bits=10)
    rel = dpcdf.release_ecdf(values, grid, epsilon=1.0)      # "auto": the most accurate mechanism
    rel.ecdf([10, 50]); rel.quantile([0.5, 0.9]); rel.statement

Three parts, dependencies one way (`fss` <- release <- service <- CLI/demo; apps use release and the
service's analyst): `dpcdf.release` (the central DP release), `dpcdf.service` (two servers, clients,
the analyst), `dpcdf.apps` (ROC/AUC, Hosmer-Lemeshow, plots). `dpcdf.Analyst`, the CLI and the demo
sit on top of all three.

Every public name is loaded when first used (PEP 562): `import dpcdf` costs the error classes only,
so `dpcdf --help` does not wait for numba, scipy or the service.
"""
from __future__ import annotations

import importlib

from .errors import DomainError as DomainError, DpcdfError as DpcdfError  # re-exported (`__all__`)
from .errors import IntegerGridWarning as IntegerGridWarning, ParameterError as ParameterError

# public name -> the module that defines it (loaded at first use)
_LAZY = {
    "HosmerLemeshow": ".apps.hosmer_lemeshow", "hosmer_lemeshow": ".apps.hosmer_lemeshow",
    "NoisyHosmerLemeshow": ".apps.hosmer_lemeshow_direct", "hosmer_lemeshow_direct": ".apps.hosmer_lemeshow_direct",
    "RocRelease": ".apps.roc", "roc": ".apps.roc",
    "Release": ".release.ecdf", "prefix_counts": ".release.ecdf", "quantiles": ".release.ecdf",
    "release_ecdf": ".release.ecdf",
    "Grid": ".release.grid",
    "AdaptiveMechanism": ".release.adaptive",
    "PathMechanism": ".release.mechanisms", "TreeMechanism": ".release.mechanisms",
    "SqrtFactorizationMechanism": ".release.factorization", "sqrt_factorization": ".release.factorization",
    "GaussianTreeMechanism": ".release.zcdp", "gaussian_tree": ".release.zcdp",
    "Analyst": ".analyst",
}
_SUBMODULES = {"metrics": ".release.metrics", "reconcile": ".service.protocols.reconciliation.maths", "release": ".release",
               "service": ".service", "apps": ".apps", "errors": ".errors"}

__all__ = sorted(["DomainError", "DpcdfError", "IntegerGridWarning", "ParameterError", "metrics", *(n for n in _LAZY if n != "Analyst")])


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name], __name__)
    else:
        raise AttributeError(f"module 'dpcdf' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
