"""Rendering: JobSpec → sbatch text and run folder (data path step 3)."""
