"""Applications built on DP ECDFs: ROC curves and AUC, the Hosmer-Lemeshow statistic (the paper's
Algorithm 2 and the direct variant), and plots. Each has a central function; the two-server variants
(`roc_from_servers`, `hosmer_lemeshow_from_servers`) take the service's analyst.

May import: `dpcdf.release`, `dpcdf.errors`, and `dpcdf.service.client.analyst` (for type hints only).
"""
