"""`dpcdf.Analyst`: the service's analyst (`dpcdf.service.client.analyst`) with the applications' two-server
variants as methods. It sits on top of both parts, like the CLI, so that neither has to import the
other's way: the service knows nothing of ROC curves, the applications use the analyst. The
applications (and scipy under them) load at the first roc() or hosmer_lemeshow() call."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .service.client import analyst as service_analyst

if TYPE_CHECKING:
    from .apps.hosmer_lemeshow import HosmerLemeshow
    from .apps.roc import RocRelease


class Analyst(service_analyst.Analyst):
    """Asks both servers, adds their shares, post-processes; see `dpcdf.service.client.analyst.Analyst`."""

    def roc(self) -> "RocRelease":
        """The DP ROC curve of a label task (`dpcdf.apps.roc.roc_from_servers`)."""
        from .apps.roc import roc_from_servers

        return roc_from_servers(self)

    def hosmer_lemeshow(self, groups: int = 10) -> "HosmerLemeshow":
        """The DP Hosmer-Lemeshow statistic of a calibration task (`hosmer_lemeshow_from_servers`)."""
        from .apps.hosmer_lemeshow import hosmer_lemeshow_from_servers

        return hosmer_lemeshow_from_servers(self, groups)
