"""Paddle-native training logs: VisualDL scalars (loss, steps/s, WAN bytes, compression ratio) per cluster, written
beside each recipe's loss.png from the runtime's metrics files and read back with VisualDL's own reader."""
from nebula.logbook.scalars import (TAGS, VISUALDL_INSTALL, LogbookUnavailable, Scalar, log_metrics_dir, read_scalars,
                                    scalars_note, scalars_of, write_scalars)

__all__ = ["Scalar", "LogbookUnavailable", "TAGS", "VISUALDL_INSTALL", "scalars_of", "write_scalars", "read_scalars",
           "log_metrics_dir", "scalars_note"]
