"""`from pipelines.explorer import Explorer`, as in Trinity-RFT; the class is in `pipelines.control`."""

from pipelines.control.explorer import Explorer

__all__ = ["Explorer"]
