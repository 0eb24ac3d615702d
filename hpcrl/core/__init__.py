"""Training core: worker group, policy interface, backends, algorithms (data path step 6)."""
