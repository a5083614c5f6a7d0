"""Test and benchmark harness: real processes (`procs`), the one local federation (`federation`), sites in network
namespaces (`netns`)."""
