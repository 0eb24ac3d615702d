"""hpcrl: recipe + cluster profile → validated plan → sbatch → Ray job → training core → report."""

__version__ = "0.1.0"
