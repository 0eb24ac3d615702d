"""Recipe and cluster-profile schemas, loading, and validation rules (data path step 1)."""
