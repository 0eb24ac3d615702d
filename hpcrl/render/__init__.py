"""JobSpec → script text through one Jinja environment; the run folder (data path step 3)."""
