"""`from pipelines.explorer import Explorer`, as in the reference; the class is in `pipelines.control`."""

from pipelines.control.explorer import Explorer

__all__ = ["Explorer"]
