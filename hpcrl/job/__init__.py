"""Inside the job: per-node entrypoint and Ray bootstrap (data path step 5)."""
