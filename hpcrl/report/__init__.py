"""Metrics reading, tables and plots for runs and sweeps (data path step 7)."""
