"""The servers' clients: the data holder's (`data_holder`: make, seal and upload reports, resumed from
its `spool` after a crash) and the analyst's (`analyst`: asks both servers, adds their shares).

    from dpcdf.service.client import create_task, make_reports, submit, Spool
"""
from .data_holder import OUTSIDE, UploadIncomplete, create_task, key_bytes, make_reports, outside_grid, submit
from .spool import Spool

__all__ = ["OUTSIDE", "Spool", "UploadIncomplete", "create_task", "key_bytes", "make_reports", "outside_grid", "submit"]
