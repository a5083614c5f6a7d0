"""Runnable jobs built on nebula's public API: abnet (Scenario II), electra (Scenario I), federated, toy."""
