"""Quality per WAN byte: every cross-cluster mode run on the same model and tokens in one process, with the WAN's
bytes counted exactly (the codecs' frames) and its time left to the link model (`nebula.plan.link`)."""
from nebula.quality.rows import MODES, RowResult, RowSpec, Traffic, read_rows, write_rows

__all__ = ["MODES", "RowSpec", "RowResult", "Traffic", "read_rows", "write_rows"]
