"""`dpcdf.service.spool.Spool`, a public path since the second round (DESIGN.md): the spool itself
lives with the rest of the data holder's client in `dpcdf/service/client/spool.py`."""
from .client.spool import Spool, SpoolBusy, SpoolMismatch, SpoolStatus

__all__ = ["Spool", "SpoolBusy", "SpoolMismatch", "SpoolStatus"]
