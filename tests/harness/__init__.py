"""The README's printed commands, run as printed (`readme`); the rest of the harness is the `testbed` package."""
