"""Package data: shipped with hpcrl and found through importlib.resources."""
