"""Submission and job management through submitit (data path step 4)."""
