"""The configuration error and the rules that keep its message one short line whatever a file holds.

Both live with the one YAML reader (security._yaml): a config file's value refused by a schema and a YAML file
refused by the reader are one kind of error, caught as one class whichever layer read the file.
"""
from __future__ import annotations

from security._yaml import MAX_MESSAGE, YamlError, one_line, show

ConfigError = YamlError  # a configuration file or value is invalid; the message names the key path and the fix

__all__ = ["ConfigError", "show", "one_line", "MAX_MESSAGE"]
