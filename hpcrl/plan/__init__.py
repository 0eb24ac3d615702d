"""Pre-flight planning: recipe × profile → JobSpec (data path step 2)."""
